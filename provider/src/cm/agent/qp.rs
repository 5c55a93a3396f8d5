//! How the CM moves an id's QP through its states: the attributes of
//! INIT, RTR and RTS for its peer (as rdma_cm's `cma_modify_qp_*`), and
//! ERR on disconnect and reject.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::cm::{gid_of, UDP_QKEY};
use crate::verbs::{AccessFlags, AhAttr, Qp, QpAttr, QpAttrMask, QpState, QpType};

use super::state::*;

pub(crate) fn st_sgid(devices: &HashMap<String, Dev>, id: &Id) -> u8 {
    let Some((name, _)) = &id.dev else { return 0 };
    let Some(src) = id.src else { return 0 };
    devices.get(name).and_then(|d| d.sgid_index(src.ip())).unwrap_or(0)
}

/// The attributes that move a QP of the id to RTR for its peer (rdma_cm's
/// `cma_modify_qp_rtr`).
pub(crate) fn rtr_attr(id: &Id, sgid: u8) -> (QpAttr, QpAttrMask) {
    let peer = id.peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: id.mtu,
        dest_qp_num: id.remote_qpn,
        rq_psn: id.remote_psn,
        ah_attr: AhAttr::roce(gid_of(peer), sgid, 1),
        max_dest_rd_atomic: id.param.responder_resources.max(1),
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    (rtr, mask)
}

/// The attributes that move a QP of the id from RTR to RTS
/// (`cma_modify_qp_rts`).
pub(crate) fn rts_attr(id: &Id) -> (QpAttr, QpAttrMask) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: id.local_psn,
        timeout: 14,
        retry_cnt: id.param.retry_count.min(7),
        rnr_retry: id.param.rnr_retry_count.min(7),
        max_rd_atomic: id.param.initiator_depth.max(1),
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    (rts, mask)
}

/// The attributes that move a new QP of type `t` to INIT (rdma_cm's
/// `cma_init_conn_qp` / `cma_init_ud_qp`).
pub(crate) fn init_attr(t: QpType) -> (QpAttr, QpAttrMask) {
    match t {
        QpType::Ud => (
            QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qkey: UDP_QKEY,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        ),
        _ => (
            QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        ),
    }
}

/// Moves the id's QP to RTR then RTS for its peer.
pub(crate) fn connect_qp(id: &Id, sgid: u8) -> crate::verbs::Result<()> {
    let Some(qp) = &id.qp else { return Ok(()) };
    let (rtr, mask) = rtr_attr(id, sgid);
    qp.modify(&rtr, mask)?;
    let (rts, mask) = rts_attr(id);
    qp.modify(&rts, mask)
}

/// Moves a new QP to INIT (RC) or through to RTS (UD), as rdma_cm does at
/// `rdma_create_qp`.
pub(crate) fn init_qp(qp: &Qp) -> crate::verbs::Result<()> {
    let (init, mask) = init_attr(qp.qp_type());
    qp.modify(&init, mask)?;
    if qp.qp_type() == QpType::Ud {
        ud_init_to_rts(qp)?;
    }
    Ok(())
}

/// Moves a UD QP in INIT on to RTR and RTS (send PSN 0), as rdma_cm does
/// at `rdma_create_qp` on either backend.
pub(crate) fn ud_init_to_rts(qp: &Qp) -> crate::verbs::Result<()> {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..QpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    )
}

/// Moves the id's QP to ERR (flushing its work), as rdma_cm does on
/// disconnect and reject.
pub(crate) fn qp_to_err(id: &Id) {
    if let Some(qp) = &id.qp {
        let _ = qp.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        );
    }
}
