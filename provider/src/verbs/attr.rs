//! Attribute structures: device, port, QP, SRQ and address handles
//! (`struct ibv_device_attr`, `ibv_port_attr`, `ibv_qp_attr`, …).

use super::types::*;

/// Device attributes (`struct ibv_device_attr`, plus the fast-registration
/// limit of the extended query).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[allow(missing_docs)] // field names and meanings are those of verbs.h
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: Guid,
    pub sys_image_guid: Guid,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: DeviceCapFlags,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub atomic_cap: Option<AtomicCap>,
    pub max_mw: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    /// Largest page list of a fast-registration MR (0: not supported).
    pub max_fast_reg_page_list_len: u32,
    /// Largest inline data a send WR may carry.
    pub max_inline_data: u32,
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // field names and meanings are those of verbs.h
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: LinkLayer,
}

/// Queue capacities (`struct ibv_qp_cap`). At create these are requests;
/// the device returns what it granted, never less than requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline payload of a send WR.
    pub max_inline_data: u32,
}

/// Global route: the GRH part of an address vector (`struct ibv_global_route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the local port's table.
    pub sgid_index: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class / DSCP+ECN.
    pub traffic_class: u8,
}

/// Address vector (`struct ibv_ah_attr`). RoCE requires the global route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// The global route (required on RoCE: `is_global` must be set).
    pub grh: GlobalRoute,
    /// Destination LID (unused on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether `grh` is valid.
    pub is_global: bool,
    /// Local port number (1-based).
    pub port_num: u8,
}

impl AhAttr {
    /// A RoCE address vector to `dgid` from GID index `sgid_index` of `port`.
    pub fn roce(dgid: Gid, sgid_index: u8, port_num: u8) -> AhAttr {
        AhAttr {
            grh: GlobalRoute {
                dgid,
                sgid_index,
                hop_limit: 64,
                ..GlobalRoute::default()
            },
            is_global: true,
            port_num,
            ..AhAttr::default()
        }
    }
}

/// QP attributes (`struct ibv_qp_attr`), used by `modify_qp` with a
/// [`QpAttrMask`] saying which fields count, and returned by `query_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // field names and meanings are those of verbs.h
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub path_mig_state: MigState,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: AccessFlags,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    /// Local ACK timeout exponent: 4.096 µs · 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Queue depth.
    pub max_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// When armed (non-zero), SRQ_LIMIT_REACHED fires once the number of
    /// posted WRs drops below it.
    pub srq_limit: u32,
}

/// A `modify_qp` request whose setters keep the [`QpAttrMask`] in step
/// with the attributes set: each `with_*` sets one field of a
/// [`QpAttr`] and its mask bit, so no bit is forgotten and none is left
/// over.
///
/// ```
/// use softverbs::verbs::{AccessFlags, QpAttrMask, QpModify, QpState};
/// let m = QpModify::new()
///     .with_state(QpState::Init)
///     .with_pkey_index(0)
///     .with_port_num(1)
///     .with_access_flags(AccessFlags::REMOTE_WRITE);
/// assert_eq!(
///     m.mask,
///     QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
/// );
/// assert_eq!(m.attr.port_num, 1);
/// // then: m.apply(&qp)?, which is qp.modify(&m.attr, m.mask)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpModify {
    /// The attributes.
    pub attr: QpAttr,
    /// Which of them count.
    pub mask: QpAttrMask,
}

macro_rules! qp_setters {
    ($($(#[$m:meta])* $name:ident($field:ident: $t:ty) => $bit:ident;)+) => {
        impl QpModify {
            $(
                $(#[$m])*
                #[must_use]
                pub fn $name(mut self, v: $t) -> QpModify {
                    self.attr.$field = v;
                    self.mask |= QpAttrMask::$bit;
                    self
                }
            )+
        }
    };
}

qp_setters! {
    /// `qp_state` ([`QpAttrMask::STATE`]).
    with_state(qp_state: QpState) => STATE;
    /// `cur_qp_state` ([`QpAttrMask::CUR_STATE`]).
    with_cur_state(cur_qp_state: QpState) => CUR_STATE;
    /// `en_sqd_async_notify` ([`QpAttrMask::EN_SQD_ASYNC_NOTIFY`]).
    with_en_sqd_async_notify(en_sqd_async_notify: bool) => EN_SQD_ASYNC_NOTIFY;
    /// `qp_access_flags` ([`QpAttrMask::ACCESS_FLAGS`]).
    with_access_flags(qp_access_flags: AccessFlags) => ACCESS_FLAGS;
    /// `pkey_index` ([`QpAttrMask::PKEY_INDEX`]).
    with_pkey_index(pkey_index: u16) => PKEY_INDEX;
    /// `port_num` ([`QpAttrMask::PORT`]).
    with_port_num(port_num: u8) => PORT;
    /// `qkey` ([`QpAttrMask::QKEY`]).
    with_qkey(qkey: u32) => QKEY;
    /// `ah_attr` ([`QpAttrMask::AV`]).
    with_ah_attr(ah_attr: AhAttr) => AV;
    /// `path_mtu` ([`QpAttrMask::PATH_MTU`]).
    with_path_mtu(path_mtu: Mtu) => PATH_MTU;
    /// `timeout` ([`QpAttrMask::TIMEOUT`]).
    with_timeout(timeout: u8) => TIMEOUT;
    /// `retry_cnt` ([`QpAttrMask::RETRY_CNT`]).
    with_retry_cnt(retry_cnt: u8) => RETRY_CNT;
    /// `rnr_retry` ([`QpAttrMask::RNR_RETRY`]).
    with_rnr_retry(rnr_retry: u8) => RNR_RETRY;
    /// `rq_psn` ([`QpAttrMask::RQ_PSN`]).
    with_rq_psn(rq_psn: u32) => RQ_PSN;
    /// `max_rd_atomic` ([`QpAttrMask::MAX_QP_RD_ATOMIC`]).
    with_max_rd_atomic(max_rd_atomic: u8) => MAX_QP_RD_ATOMIC;
    /// `min_rnr_timer` ([`QpAttrMask::MIN_RNR_TIMER`]).
    with_min_rnr_timer(min_rnr_timer: u8) => MIN_RNR_TIMER;
    /// `sq_psn` ([`QpAttrMask::SQ_PSN`]).
    with_sq_psn(sq_psn: u32) => SQ_PSN;
    /// `max_dest_rd_atomic` ([`QpAttrMask::MAX_DEST_RD_ATOMIC`]).
    with_max_dest_rd_atomic(max_dest_rd_atomic: u8) => MAX_DEST_RD_ATOMIC;
    /// `path_mig_state` ([`QpAttrMask::PATH_MIG_STATE`]).
    with_path_mig_state(path_mig_state: MigState) => PATH_MIG_STATE;
    /// `cap` ([`QpAttrMask::CAP`]).
    with_cap(cap: QpCap) => CAP;
    /// `dest_qp_num` ([`QpAttrMask::DEST_QPN`]).
    with_dest_qp_num(dest_qp_num: u32) => DEST_QPN;
    /// `rate_limit` ([`QpAttrMask::RATE_LIMIT`]).
    with_rate_limit(rate_limit: u32) => RATE_LIMIT;
}

impl QpModify {
    /// Nothing set yet.
    pub fn new() -> QpModify {
        QpModify::default()
    }

    /// The alternate path ([`QpAttrMask::ALT_PATH`]): its address vector,
    /// P_Key index, port and timeout.
    #[must_use]
    pub fn with_alt_path(mut self, ah: AhAttr, pkey_index: u16, port_num: u8, timeout: u8) -> QpModify {
        self.attr.alt_ah_attr = ah;
        self.attr.alt_pkey_index = pkey_index;
        self.attr.alt_port_num = port_num;
        self.attr.alt_timeout = timeout;
        self.mask |= QpAttrMask::ALT_PATH;
        self
    }

    /// `qp.modify(&self.attr, self.mask)`.
    ///
    /// # Errors
    ///
    /// As [`Qp::modify`](super::Qp::modify).
    pub fn apply(&self, qp: &super::handle::Qp) -> super::error::Result<()> {
        qp.modify(&self.attr, self.mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setter_sets_its_field_and_only_its_bit() {
        let m = QpModify::new().with_rq_psn(5);
        assert_eq!((m.mask, m.attr.rq_psn), (QpAttrMask::RQ_PSN, 5));
        let m = QpModify::new().with_max_rd_atomic(3);
        assert_eq!((m.mask, m.attr.max_rd_atomic), (QpAttrMask::MAX_QP_RD_ATOMIC, 3));
        let m = QpModify::new().with_alt_path(AhAttr::default(), 0, 1, 9);
        assert_eq!((m.mask, m.attr.alt_timeout), (QpAttrMask::ALT_PATH, 9));
        let m = QpModify::new()
            .with_state(QpState::Rts)
            .with_sq_psn(1)
            .with_timeout(14)
            .with_retry_cnt(7)
            .with_rnr_retry(7)
            .with_max_rd_atomic(1);
        assert_eq!(
            m.mask,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        );
        assert_eq!(QpModify::new().mask, QpAttrMask::empty());
    }
}
