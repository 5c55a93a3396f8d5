//! Every conversion of `convert.rs`, in both directions where both exist,
//! against the constants bindgen generated from the installed `verbs.h`
//! and against the literal numbers of rdma-core's header. No device needed.

use std::sync::Arc;

use rdma_sys::{
    ibv_access_flags, ibv_atomic_cap, ibv_device_cap_flags, ibv_event_type, ibv_mig_state, ibv_mtu, ibv_mw_type,
    ibv_port_state, ibv_qp_attr_mask, ibv_qp_state, ibv_qp_type, ibv_rereg_mr_flags, ibv_send_flags, ibv_srq_attr_mask,
    ibv_wc_flags, ibv_wc_opcode, ibv_wc_status,
};

use super::super::ffi::{zeroed, IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_UNSPECIFIED};
use super::*;
use crate::verbs::backend::{MrOps, MwOps, PdOps};

/// Checks an enum both ways: API value → number, number → API value.
macro_rules! both_ways {
    ($ty:ty: $($variant:expr => $raw:expr),+ $(,)?) => {{
        let pairs = [$(($variant, $raw)),+];
        for (v, raw) in pairs {
            assert_eq!(v.as_raw(), raw, "{v:?} as_raw");
            assert_eq!(<$ty>::from_raw(raw), Some(v), "{raw} from_raw");
        }
        assert_eq!(pairs.len(), <$ty>::ALL.len(), "every {} value is covered", stringify!($ty));
    }};
}

#[test]
fn qp_type_state_mtu_mig() {
    both_ways!(QpType:
        QpType::Rc => ibv_qp_type::IBV_QPT_RC,
        QpType::Uc => ibv_qp_type::IBV_QPT_UC,
        QpType::Ud => ibv_qp_type::IBV_QPT_UD,
    );
    assert_eq!(
        (QpType::Rc.as_raw(), QpType::Uc.as_raw(), QpType::Ud.as_raw()),
        (2, 3, 4)
    );
    both_ways!(QpState:
        QpState::Reset => ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
        QpState::Sqd => ibv_qp_state::IBV_QPS_SQD,
        QpState::Sqe => ibv_qp_state::IBV_QPS_SQE,
        QpState::Err => ibv_qp_state::IBV_QPS_ERR,
    );
    assert_eq!(QpState::from_raw(ibv_qp_state::IBV_QPS_UNKNOWN), None);
    both_ways!(Mtu:
        Mtu::Mtu256 => ibv_mtu::IBV_MTU_256,
        Mtu::Mtu512 => ibv_mtu::IBV_MTU_512,
        Mtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
        Mtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
        Mtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
    );
    assert_eq!(Mtu::Mtu256.as_raw(), 1);
    both_ways!(MigState:
        MigState::Migrated => ibv_mig_state::IBV_MIG_MIGRATED,
        MigState::Rearm => ibv_mig_state::IBV_MIG_REARM,
        MigState::Armed => ibv_mig_state::IBV_MIG_ARMED,
    );
}

#[test]
fn port_state_link_layer_atomic_mw() {
    both_ways!(PortState:
        PortState::Nop => ibv_port_state::IBV_PORT_NOP,
        PortState::Down => ibv_port_state::IBV_PORT_DOWN,
        PortState::Init => ibv_port_state::IBV_PORT_INIT,
        PortState::Armed => ibv_port_state::IBV_PORT_ARMED,
        PortState::Active => ibv_port_state::IBV_PORT_ACTIVE,
        PortState::ActiveDefer => ibv_port_state::IBV_PORT_ACTIVE_DEFER,
    );
    both_ways!(LinkLayer:
        LinkLayer::Unspecified => IBV_LINK_LAYER_UNSPECIFIED,
        LinkLayer::InfiniBand => IBV_LINK_LAYER_INFINIBAND,
        LinkLayer::Ethernet => IBV_LINK_LAYER_ETHERNET,
    );
    assert_eq!(IBV_LINK_LAYER_ETHERNET, 2, "verbs.h: UNSPECIFIED, INFINIBAND, ETHERNET");
    for ll in LinkLayer::ALL {
        assert_eq!(link_layer_from_raw(ll.as_raw()), *ll);
    }
    assert_eq!(link_layer_from_raw(7), LinkLayer::Unspecified);
    both_ways!(AtomicCap:
        AtomicCap::None => ibv_atomic_cap::IBV_ATOMIC_NONE,
        AtomicCap::Hca => ibv_atomic_cap::IBV_ATOMIC_HCA,
        AtomicCap::Glob => ibv_atomic_cap::IBV_ATOMIC_GLOB,
    );
    both_ways!(MwType:
        MwType::Type1 => ibv_mw_type::IBV_MW_TYPE_1,
        MwType::Type2 => ibv_mw_type::IBV_MW_TYPE_2,
    );
}

#[test]
fn wc_status_every_value() {
    use ibv_wc_status::*;
    both_ways!(WcStatus:
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocLenErr => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocEecOpErr => IBV_WC_LOC_EEC_OP_ERR,
        WcStatus::LocProtErr => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => IBV_WC_WR_FLUSH_ERR,
        WcStatus::MwBindErr => IBV_WC_MW_BIND_ERR,
        WcStatus::BadRespErr => IBV_WC_BAD_RESP_ERR,
        WcStatus::LocAccessErr => IBV_WC_LOC_ACCESS_ERR,
        WcStatus::RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::LocRddViolErr => IBV_WC_LOC_RDD_VIOL_ERR,
        WcStatus::RemInvRdReqErr => IBV_WC_REM_INV_RD_REQ_ERR,
        WcStatus::RemAbortErr => IBV_WC_REM_ABORT_ERR,
        WcStatus::InvEecnErr => IBV_WC_INV_EECN_ERR,
        WcStatus::InvEecStateErr => IBV_WC_INV_EEC_STATE_ERR,
        WcStatus::FatalErr => IBV_WC_FATAL_ERR,
        WcStatus::RespTimeoutErr => IBV_WC_RESP_TIMEOUT_ERR,
        WcStatus::GeneralErr => IBV_WC_GENERAL_ERR,
        WcStatus::TmErr => IBV_WC_TM_ERR,
        WcStatus::TmRndvIncomplete => IBV_WC_TM_RNDV_INCOMPLETE,
    );
    for s in WcStatus::ALL {
        assert_eq!(wc_status_from_raw(s.as_raw()), *s);
    }
    assert_eq!(wc_status_from_raw(99), WcStatus::GeneralErr);
}

#[test]
fn wc_opcodes() {
    use ibv_wc_opcode::*;
    let pairs = [
        (WcOpcode::Send, IBV_WC_SEND),
        (WcOpcode::RdmaWrite, IBV_WC_RDMA_WRITE),
        (WcOpcode::RdmaRead, IBV_WC_RDMA_READ),
        (WcOpcode::CompSwap, IBV_WC_COMP_SWAP),
        (WcOpcode::FetchAdd, IBV_WC_FETCH_ADD),
        (WcOpcode::BindMw, IBV_WC_BIND_MW),
        (WcOpcode::LocalInv, IBV_WC_LOCAL_INV),
        (WcOpcode::Recv, IBV_WC_RECV),
        (WcOpcode::RecvRdmaWithImm, IBV_WC_RECV_RDMA_WITH_IMM),
    ];
    for (op, raw) in pairs {
        assert_eq!(op.as_raw(), raw);
        assert_eq!(wc_opcode_from_raw(raw), Some(op));
    }
    // Kernel-only REG_MR keeps the kernel's number; user space never
    // reports it. What the API lacks is None.
    assert_eq!(WcOpcode::RegMr.as_raw(), 10);
    for raw in [IBV_WC_TSO, IBV_WC_ATOMIC_WRITE, IBV_WC_TM_ADD, IBV_WC_DRIVER1] {
        assert_eq!(wc_opcode_from_raw(raw), None, "{raw}");
    }
}

#[test]
fn access_send_wc_flags() {
    let access = [
        (AccessFlags::LOCAL_WRITE, ibv_access_flags::IBV_ACCESS_LOCAL_WRITE),
        (AccessFlags::REMOTE_WRITE, ibv_access_flags::IBV_ACCESS_REMOTE_WRITE),
        (AccessFlags::REMOTE_READ, ibv_access_flags::IBV_ACCESS_REMOTE_READ),
        (AccessFlags::REMOTE_ATOMIC, ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC),
        (AccessFlags::MW_BIND, ibv_access_flags::IBV_ACCESS_MW_BIND),
        (AccessFlags::ZERO_BASED, ibv_access_flags::IBV_ACCESS_ZERO_BASED),
        (AccessFlags::ON_DEMAND, ibv_access_flags::IBV_ACCESS_ON_DEMAND),
        (AccessFlags::HUGETLB, ibv_access_flags::IBV_ACCESS_HUGETLB),
        (
            AccessFlags::RELAXED_ORDERING,
            ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING,
        ),
    ];
    for (f, raw) in access {
        assert_eq!(access_to_raw(f), raw.0, "{f:?}");
        assert_eq!(access_from_raw(raw.0), f);
    }
    assert_eq!(access_from_raw(1 << 29).bits(), 1 << 29, "unknown bits kept");
    assert_eq!(access_to_raw(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ), 5);

    let send = [
        (SendFlags::FENCE, ibv_send_flags::IBV_SEND_FENCE),
        (SendFlags::SIGNALED, ibv_send_flags::IBV_SEND_SIGNALED),
        (SendFlags::SOLICITED, ibv_send_flags::IBV_SEND_SOLICITED),
        (SendFlags::INLINE, ibv_send_flags::IBV_SEND_INLINE),
        (SendFlags::IP_CSUM, ibv_send_flags::IBV_SEND_IP_CSUM),
    ];
    for (f, raw) in send {
        assert_eq!(send_flags_to_raw(f), raw.0, "{f:?}");
        assert_eq!(SendFlags::from_bits(raw.0), Some(f));
    }

    let wc = [
        (WcFlags::GRH, ibv_wc_flags::IBV_WC_GRH),
        (WcFlags::WITH_IMM, ibv_wc_flags::IBV_WC_WITH_IMM),
        (WcFlags::IP_CSUM_OK, ibv_wc_flags::IBV_WC_IP_CSUM_OK),
        (WcFlags::WITH_INV, ibv_wc_flags::IBV_WC_WITH_INV),
    ];
    for (f, raw) in wc {
        assert_eq!(f.bits(), raw.0, "{f:?}");
        let mut w: ibv_wc = zeroed();
        w.wc_flags = raw.0 | ibv_wc_flags::IBV_WC_TM_MATCH.0;
        assert_eq!(wc_from_raw(&w).wc_flags, f, "tag-matching bits dropped");
    }
}

#[test]
fn qp_attr_mask_bits() {
    let masks = [
        (QpAttrMask::STATE, ibv_qp_attr_mask::IBV_QP_STATE),
        (QpAttrMask::CUR_STATE, ibv_qp_attr_mask::IBV_QP_CUR_STATE),
        (
            QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            ibv_qp_attr_mask::IBV_QP_EN_SQD_ASYNC_NOTIFY,
        ),
        (QpAttrMask::ACCESS_FLAGS, ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS),
        (QpAttrMask::PKEY_INDEX, ibv_qp_attr_mask::IBV_QP_PKEY_INDEX),
        (QpAttrMask::PORT, ibv_qp_attr_mask::IBV_QP_PORT),
        (QpAttrMask::QKEY, ibv_qp_attr_mask::IBV_QP_QKEY),
        (QpAttrMask::AV, ibv_qp_attr_mask::IBV_QP_AV),
        (QpAttrMask::PATH_MTU, ibv_qp_attr_mask::IBV_QP_PATH_MTU),
        (QpAttrMask::TIMEOUT, ibv_qp_attr_mask::IBV_QP_TIMEOUT),
        (QpAttrMask::RETRY_CNT, ibv_qp_attr_mask::IBV_QP_RETRY_CNT),
        (QpAttrMask::RNR_RETRY, ibv_qp_attr_mask::IBV_QP_RNR_RETRY),
        (QpAttrMask::RQ_PSN, ibv_qp_attr_mask::IBV_QP_RQ_PSN),
        (QpAttrMask::MAX_QP_RD_ATOMIC, ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC),
        (QpAttrMask::ALT_PATH, ibv_qp_attr_mask::IBV_QP_ALT_PATH),
        (QpAttrMask::MIN_RNR_TIMER, ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER),
        (QpAttrMask::SQ_PSN, ibv_qp_attr_mask::IBV_QP_SQ_PSN),
        (
            QpAttrMask::MAX_DEST_RD_ATOMIC,
            ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
        ),
        (QpAttrMask::PATH_MIG_STATE, ibv_qp_attr_mask::IBV_QP_PATH_MIG_STATE),
        (QpAttrMask::CAP, ibv_qp_attr_mask::IBV_QP_CAP),
        (QpAttrMask::DEST_QPN, ibv_qp_attr_mask::IBV_QP_DEST_QPN),
        (QpAttrMask::RATE_LIMIT, ibv_qp_attr_mask::IBV_QP_RATE_LIMIT),
    ];
    for (m, raw) in masks {
        assert_eq!(qp_attr_mask_to_raw(m), raw.0 as c_int, "{m:?}");
        assert_eq!(qp_attr_mask_from_raw(raw.0 as c_int), m);
    }
    assert_eq!(masks.len(), QpAttrMask::all().iter().count());
    let rtr = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN;
    assert_eq!(qp_attr_mask_to_raw(rtr), 1 | 128 | 256 | (1 << 20));
}

#[test]
fn srq_rereg_device_cap_bits() {
    assert_eq!(
        srq_attr_mask_to_raw(SrqAttrMask::MAX_WR),
        ibv_srq_attr_mask::IBV_SRQ_MAX_WR.0 as c_int
    );
    assert_eq!(
        srq_attr_mask_to_raw(SrqAttrMask::LIMIT),
        ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as c_int
    );
    let rereg = [
        (
            ReregFlags::CHANGE_TRANSLATION,
            ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_TRANSLATION,
        ),
        (ReregFlags::CHANGE_PD, ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_PD),
        (
            ReregFlags::CHANGE_ACCESS,
            ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS,
        ),
    ];
    for (f, raw) in rereg {
        assert_eq!(rereg_flags_to_raw(f), raw.0 as c_int);
    }
    assert_eq!(
        rereg_flags_to_raw(ReregFlags::all()),
        ibv_rereg_mr_flags::IBV_REREG_MR_FLAGS_SUPPORTED.0 as c_int
    );
    let caps = [
        (
            DeviceCapFlags::RESIZE_MAX_WR,
            ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR,
        ),
        (
            DeviceCapFlags::BAD_PKEY_CNTR,
            ibv_device_cap_flags::IBV_DEVICE_BAD_PKEY_CNTR,
        ),
        (
            DeviceCapFlags::BAD_QKEY_CNTR,
            ibv_device_cap_flags::IBV_DEVICE_BAD_QKEY_CNTR,
        ),
        (
            DeviceCapFlags::AUTO_PATH_MIG,
            ibv_device_cap_flags::IBV_DEVICE_AUTO_PATH_MIG,
        ),
        (
            DeviceCapFlags::CURR_QP_STATE_MOD,
            ibv_device_cap_flags::IBV_DEVICE_CURR_QP_STATE_MOD,
        ),
        (
            DeviceCapFlags::PORT_ACTIVE_EVENT,
            ibv_device_cap_flags::IBV_DEVICE_PORT_ACTIVE_EVENT,
        ),
        (
            DeviceCapFlags::SYS_IMAGE_GUID,
            ibv_device_cap_flags::IBV_DEVICE_SYS_IMAGE_GUID,
        ),
        (
            DeviceCapFlags::RC_RNR_NAK_GEN,
            ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN,
        ),
        (DeviceCapFlags::SRQ_RESIZE, ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE),
        (
            DeviceCapFlags::N_NOTIFY_CQ,
            ibv_device_cap_flags::IBV_DEVICE_N_NOTIFY_CQ,
        ),
        (DeviceCapFlags::MEM_WINDOW, ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW),
        (
            DeviceCapFlags::MEM_MGT_EXTENSIONS,
            ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS,
        ),
        (
            DeviceCapFlags::MEM_WINDOW_TYPE_2A,
            ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A,
        ),
        (
            DeviceCapFlags::MEM_WINDOW_TYPE_2B,
            ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        ),
    ];
    for (f, raw) in caps {
        assert_eq!(f.bits(), u64::from(raw.0), "{f:?}");
        let mut a: ibv_device_attr = zeroed();
        a.device_cap_flags = raw.0;
        assert_eq!(device_attr_from_raw(&a).device_cap_flags, f);
    }
}

#[test]
fn event_types_and_subjects() {
    use ibv_event_type::*;
    let pairs = [
        (EventType::CqErr, IBV_EVENT_CQ_ERR, EventSubject::Cq),
        (EventType::QpFatal, IBV_EVENT_QP_FATAL, EventSubject::Qp),
        (EventType::QpReqErr, IBV_EVENT_QP_REQ_ERR, EventSubject::Qp),
        (EventType::QpAccessErr, IBV_EVENT_QP_ACCESS_ERR, EventSubject::Qp),
        (EventType::CommEst, IBV_EVENT_COMM_EST, EventSubject::Qp),
        (EventType::SqDrained, IBV_EVENT_SQ_DRAINED, EventSubject::Qp),
        (EventType::PathMig, IBV_EVENT_PATH_MIG, EventSubject::Qp),
        (EventType::PathMigErr, IBV_EVENT_PATH_MIG_ERR, EventSubject::Qp),
        (EventType::DeviceFatal, IBV_EVENT_DEVICE_FATAL, EventSubject::Device),
        (EventType::PortActive, IBV_EVENT_PORT_ACTIVE, EventSubject::Port),
        (EventType::PortErr, IBV_EVENT_PORT_ERR, EventSubject::Port),
        (EventType::LidChange, IBV_EVENT_LID_CHANGE, EventSubject::Port),
        (EventType::PkeyChange, IBV_EVENT_PKEY_CHANGE, EventSubject::Port),
        (EventType::SmChange, IBV_EVENT_SM_CHANGE, EventSubject::Port),
        (EventType::SrqErr, IBV_EVENT_SRQ_ERR, EventSubject::Srq),
        (
            EventType::SrqLimitReached,
            IBV_EVENT_SRQ_LIMIT_REACHED,
            EventSubject::Srq,
        ),
        (
            EventType::QpLastWqeReached,
            IBV_EVENT_QP_LAST_WQE_REACHED,
            EventSubject::Qp,
        ),
        (
            EventType::ClientReregister,
            IBV_EVENT_CLIENT_REREGISTER,
            EventSubject::Port,
        ),
        (EventType::GidChange, IBV_EVENT_GID_CHANGE, EventSubject::Port),
        (EventType::WqFatal, IBV_EVENT_WQ_FATAL, EventSubject::Wq),
    ];
    assert_eq!(pairs.len(), EventType::ALL.len());
    for (ty, raw, subject) in pairs {
        assert_eq!(ty.as_raw(), raw as u32, "{ty:?}");
        assert_eq!(event_from_raw(raw as u32), Some((ty, subject)));
    }
    assert_eq!(event_from_raw(20), None);
}

#[test]
fn imm_data_is_big_endian_both_ways() {
    let host = 0x1234_5678u32;
    let raw = imm_to_raw(host);
    assert_eq!(raw.to_ne_bytes(), [0x12, 0x34, 0x56, 0x78], "network order in memory");
    assert_eq!(imm_from_raw(raw), host);

    let mut w: ibv_wc = zeroed();
    w.wr_id = 77;
    w.status = ibv_wc_status::IBV_WC_SUCCESS;
    w.opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
    w.byte_len = 4096;
    w.imm_data_invalidated_rkey_union.imm_data = u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]);
    w.qp_num = 0x11;
    w.src_qp = 0x22;
    w.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0 | ibv_wc_flags::IBV_WC_GRH.0;
    w.pkey_index = 3;
    w.slid = 4;
    w.sl = 5;
    w.dlid_path_bits = 6;
    w.vendor_err = 9;
    let wc = wc_from_raw(&w);
    assert_eq!(
        wc,
        WorkCompletion {
            wr_id: 77,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            vendor_err: 9,
            byte_len: 4096,
            imm_data: 0xdead_beef,
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: WcFlags::WITH_IMM | WcFlags::GRH,
            pkey_index: 3,
            slid: 4,
            sl: 5,
            dlid_path_bits: 6,
        }
    );
    assert_eq!(wc.imm(), Some(0xdead_beef));
}

#[test]
fn wc_with_inv_and_errors() {
    let mut w: ibv_wc = zeroed();
    w.opcode = ibv_wc_opcode::IBV_WC_RECV;
    w.imm_data_invalidated_rkey_union.invalidated_rkey = 0x0001_2345;
    w.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
    let wc = wc_from_raw(&w);
    assert_eq!(wc.invalidated_rkey(), Some(0x0001_2345), "host order, not swapped");
    assert_eq!(wc.imm(), None);

    w.wc_flags = 0;
    assert_eq!(wc_from_raw(&w).imm_data, 0, "no flag, no value");

    let mut e: ibv_wc = zeroed();
    e.wr_id = 5;
    e.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
    e.opcode = 0xffff; // undefined in error completions
    e.vendor_err = 0x244;
    let wc = wc_from_raw(&e);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.vendor_err),
        (5, WcStatus::WrFlushErr, WcOpcode::Send, 0x244)
    );
    e.status = 1000;
    assert_eq!(wc_from_raw(&e).status, WcStatus::GeneralErr);
}

#[test]
fn gid_guid_and_ah_attr_round_trip() {
    let gid: Gid = "fe80::1234:5678".parse().unwrap();
    let raw = gid_to_raw(gid);
    // SAFETY: reading a plain-bytes union member.
    assert_eq!(unsafe { raw.raw }, gid.0);
    // SAFETY: the other member of the same union; both are plain data.
    let global = unsafe { raw.global };
    assert_eq!(u64::from_be(global.subnet_prefix), gid.subnet_prefix());
    assert_eq!(u64::from_be(global.interface_id), gid.interface_id());
    assert_eq!(gid_from_raw(&raw), gid);
    assert_eq!(
        guid_from_raw(0x0001_0203_0405_0607u64.to_be()),
        Guid(0x0001_0203_0405_0607)
    );

    let ah = AhAttr {
        grh: GlobalRoute {
            dgid: "10.1.2.3".parse().unwrap(),
            flow_label: 0xabcde,
            sgid_index: 3,
            hop_limit: 64,
            traffic_class: 0x68,
        },
        dlid: 0x1234,
        sl: 2,
        src_path_bits: 1,
        static_rate: 7,
        is_global: true,
        port_num: 1,
    };
    let raw = ah_attr_to_raw(&ah);
    assert_eq!(raw.is_global, 1);
    assert_eq!(
        (raw.grh.sgid_index, raw.grh.hop_limit, raw.grh.traffic_class),
        (3, 64, 0x68)
    );
    assert_eq!(raw.grh.flow_label, 0xabcde);
    assert_eq!(
        (raw.dlid, raw.sl, raw.src_path_bits, raw.static_rate, raw.port_num),
        (0x1234, 2, 1, 7, 1)
    );
    // SAFETY: plain-bytes union member.
    assert_eq!(unsafe { raw.grh.dgid.raw }[10..], [0xff, 0xff, 10, 1, 2, 3]);
    assert_eq!(ah_attr_from_raw(&raw), ah);
    let local = AhAttr { is_global: false, ..ah };
    assert_eq!(ah_attr_to_raw(&local).is_global, 0);
    assert_eq!(ah_attr_from_raw(&ah_attr_to_raw(&local)), local);
}

#[test]
fn qp_attr_and_cap_round_trip() {
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 2,
        max_inline_data: 220,
    };
    let rc = qp_cap_to_raw(&cap);
    assert_eq!(
        (
            rc.max_send_wr,
            rc.max_recv_wr,
            rc.max_send_sge,
            rc.max_recv_sge,
            rc.max_inline_data
        ),
        (128, 256, 4, 2, 220)
    );
    assert_eq!(qp_cap_from_raw(&rc), cap);

    let attr = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu4096,
        path_mig_state: MigState::Armed,
        qkey: 0x1111_1111,
        rq_psn: 0x00ab_cdef,
        sq_psn: 0x0012_3456,
        dest_qp_num: 0x00ff_0001,
        qp_access_flags: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        cap,
        ah_attr: AhAttr::roce("192.168.0.9".parse().unwrap(), 1, 1),
        alt_ah_attr: AhAttr::roce("192.168.0.10".parse().unwrap(), 2, 2),
        pkey_index: 1,
        alt_pkey_index: 2,
        en_sqd_async_notify: true,
        sq_draining: true,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 8,
        min_rnr_timer: 12,
        port_num: 1,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 6,
        alt_port_num: 2,
        alt_timeout: 18,
        rate_limit: 1000,
    };
    let raw = qp_attr_to_raw(&attr);
    assert_eq!(raw.qp_state, ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(raw.cur_qp_state, ibv_qp_state::IBV_QPS_RTR);
    assert_eq!(raw.path_mtu, ibv_mtu::IBV_MTU_4096);
    assert_eq!(raw.path_mig_state, ibv_mig_state::IBV_MIG_ARMED);
    assert_eq!(raw.qp_access_flags, 6);
    assert_eq!((raw.en_sqd_async_notify, raw.sq_draining), (1, 1));
    assert_eq!(
        (raw.max_rd_atomic, raw.max_dest_rd_atomic, raw.min_rnr_timer),
        (16, 8, 12)
    );
    assert_eq!((raw.timeout, raw.retry_cnt, raw.rnr_retry), (14, 7, 6));
    assert_eq!((raw.alt_port_num, raw.alt_timeout, raw.rate_limit), (2, 18, 1000));
    assert_eq!(raw.ah_attr.grh.sgid_index, 1);
    assert_eq!(raw.alt_ah_attr.port_num, 2);
    assert_eq!(qp_attr_from_raw(&raw).unwrap(), attr);
}

#[test]
fn qp_attr_from_device_values() {
    // A QP in RESET reports path_mtu 0: read as the API default.
    let mut raw: ibv_qp_attr = zeroed();
    let attr = qp_attr_from_raw(&raw).unwrap();
    assert_eq!(attr.qp_state, QpState::Reset);
    assert_eq!(attr.path_mtu, QpAttr::default().path_mtu);
    raw.qp_state = ibv_qp_state::IBV_QPS_UNKNOWN;
    let e = qp_attr_from_raw(&raw).unwrap_err();
    assert_eq!((e.verb(), e.kind()), (Verb::QueryQp, ErrorKind::Io));
}

#[test]
fn srq_attr_round_trip() {
    let a = SrqAttr {
        max_wr: 1024,
        max_sge: 3,
        srq_limit: 16,
    };
    let r = srq_attr_to_raw(&a);
    assert_eq!((r.max_wr, r.max_sge, r.srq_limit), (1024, 3, 16));
    assert_eq!(srq_attr_from_raw(&r), a);
}

#[test]
fn port_attr_from_device() {
    let mut p: ibv_port_attr = zeroed();
    p.state = ibv_port_state::IBV_PORT_ACTIVE;
    p.max_mtu = ibv_mtu::IBV_MTU_4096;
    p.active_mtu = ibv_mtu::IBV_MTU_1024;
    p.gid_tbl_len = 256;
    p.port_cap_flags = 0x0405_0000;
    p.max_msg_sz = 1 << 30;
    p.bad_pkey_cntr = 1;
    p.qkey_viol_cntr = 2;
    p.pkey_tbl_len = 1;
    p.lid = 0;
    p.sm_lid = 0;
    p.lmc = 0;
    p.max_vl_num = 4;
    p.sm_sl = 0;
    p.subnet_timeout = 18;
    p.active_width = 2;
    p.active_speed = 32;
    p.phys_state = 5;
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    let a = port_attr_from_raw(&p).unwrap();
    assert_eq!(a.state, PortState::Active);
    assert_eq!((a.max_mtu, a.active_mtu), (Mtu::Mtu4096, Mtu::Mtu1024));
    assert_eq!(
        (a.gid_tbl_len, a.port_cap_flags, a.max_msg_sz),
        (256, 0x0405_0000, 1 << 30)
    );
    assert_eq!((a.bad_pkey_cntr, a.qkey_viol_cntr, a.pkey_tbl_len), (1, 2, 1));
    assert_eq!(
        (
            a.max_vl_num,
            a.subnet_timeout,
            a.active_width,
            a.active_speed,
            a.phys_state
        ),
        (4, 18, 2, 32, 5)
    );
    assert_eq!(a.link_layer, LinkLayer::Ethernet);
    p.link_layer = 9;
    assert_eq!(port_attr_from_raw(&p).unwrap().link_layer, LinkLayer::Unspecified);
    p.state = 42;
    let e = port_attr_from_raw(&p).unwrap_err();
    assert_eq!((e.verb(), e.kind()), (Verb::QueryPort, ErrorKind::Io));
    p.state = ibv_port_state::IBV_PORT_DOWN;
    p.active_mtu = 0;
    assert!(port_attr_from_raw(&p).is_err());
}

#[test]
fn device_attr_from_device() {
    let mut a: ibv_device_attr = zeroed();
    for (dst, src) in a.fw_ver.iter_mut().zip(b"16.35.2000\0") {
        *dst = *src as c_char;
    }
    a.node_guid = 0x0c42_a103_0065_4321u64.to_be();
    a.sys_image_guid = 0x0c42_a103_0065_4320u64.to_be();
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = 0x02c9;
    a.vendor_part_id = 4123;
    a.hw_ver = 0;
    a.max_qp = 131_072;
    a.max_qp_wr = 32_768;
    a.max_sge = 30;
    a.max_sge_rd = 30;
    a.max_cq = 16_777_216;
    a.max_cqe = 4_194_303;
    a.max_mr = 16_777_216;
    a.max_pd = 8_388_608;
    a.max_qp_rd_atom = 16;
    a.max_res_rd_atom = 2_097_152;
    a.max_qp_init_rd_atom = 16;
    a.atomic_cap = ibv_atomic_cap::IBV_ATOMIC_HCA;
    a.max_mw = 16_777_216;
    a.max_ah = i32::MAX;
    a.max_srq = 8_388_608;
    a.max_srq_wr = 32_767;
    a.max_srq_sge = 31;
    a.max_pkeys = 128;
    a.local_ca_ack_delay = 16;
    a.phys_port_cnt = 1;
    a.max_cq = -1; // a broken driver: reads as 0, never wraps
    let d = device_attr_from_raw(&a);
    assert_eq!(d.fw_ver, "16.35.2000");
    assert_eq!(d.node_guid.to_string(), "0c42:a103:0065:4321");
    assert_eq!(d.sys_image_guid, Guid(0x0c42_a103_0065_4320));
    assert_eq!(
        (d.max_mr_size, d.page_size_cap, d.vendor_id, d.vendor_part_id),
        (u64::MAX, 0xffff_f000, 0x02c9, 4123)
    );
    assert_eq!(
        (d.max_qp, d.max_qp_wr, d.max_sge, d.max_sge_rd),
        (131_072, 32_768, 30, 30)
    );
    assert_eq!(
        (d.max_cq, d.max_cqe, d.max_mr, d.max_pd),
        (0, 4_194_303, 16_777_216, 8_388_608)
    );
    assert_eq!(
        (d.max_qp_rd_atom, d.max_res_rd_atom, d.max_qp_init_rd_atom),
        (16, 2_097_152, 16)
    );
    assert_eq!(d.atomic_cap, Some(AtomicCap::Hca));
    assert_eq!(
        (d.max_mw, d.max_ah, d.max_srq, d.max_srq_wr, d.max_srq_sge),
        (16_777_216, i32::MAX as u32, 8_388_608, 32_767, 31)
    );
    assert_eq!((d.max_pkeys, d.local_ca_ack_delay, d.phys_port_cnt), (128, 16, 1));
    assert_eq!((d.max_fast_reg_page_list_len, d.max_inline_data), (0, 0));
}

/// Minimal MR and MW doubles, so that every [`SendOp`] can be built.
struct FakeMr;
struct FakeMw;

impl MrOps for FakeMr {
    fn lkey(&self) -> u32 {
        1
    }
    fn rkey(&self) -> u32 {
        2
    }
    fn addr(&self) -> u64 {
        0
    }
    fn length(&self) -> u64 {
        0
    }
    fn access(&self) -> AccessFlags {
        AccessFlags::empty()
    }
    fn memory(&self) -> Option<Arc<MemorySource>> {
        None
    }
    fn rereg(&self, _: ReregFlags, _: Option<&Arc<dyn PdOps>>, _: Option<MemorySource>, _: AccessFlags) -> Result<()> {
        Ok(())
    }
    fn map_pages(&self, _: &[Sge<'_>], _: u32) -> Result<usize> {
        Ok(0)
    }
    fn dereg(&self) -> Result<()> {
        Ok(())
    }
}

impl MwOps for FakeMw {
    fn rkey(&self) -> u32 {
        3
    }
    fn mw_type(&self) -> MwType {
        MwType::Type2
    }
    fn dealloc(&self) -> Result<()> {
        Ok(())
    }
}

#[test]
fn send_opcodes_match_verbs_h() {
    let mr = Mr::from_ops(Arc::new(FakeMr));
    let mw = Mw::from_ops(Arc::new(FakeMw));
    assert!(super::super::downcast::<FakeMr, _>(mr.ops()).is_some());
    let remote = RemoteAddr { addr: 8, rkey: 9 };
    let bind = MwBindInfo {
        mr: &mr,
        addr: 0,
        length: 0,
        access: AccessFlags::REMOTE_READ,
    };
    use ibv_wr_opcode::*;
    let table = [
        (SendOp::Write { remote }, Some(IBV_WR_RDMA_WRITE), 0),
        (
            SendOp::WriteWithImm { remote, imm: 1 },
            Some(IBV_WR_RDMA_WRITE_WITH_IMM),
            1,
        ),
        (SendOp::Send, Some(IBV_WR_SEND), 2),
        (SendOp::SendWithImm { imm: 1 }, Some(IBV_WR_SEND_WITH_IMM), 3),
        (SendOp::Read { remote }, Some(IBV_WR_RDMA_READ), 4),
        (
            SendOp::CompareSwap {
                remote,
                compare: 1,
                swap: 2,
            },
            Some(IBV_WR_ATOMIC_CMP_AND_SWP),
            5,
        ),
        (
            SendOp::FetchAdd { remote, add: 1 },
            Some(IBV_WR_ATOMIC_FETCH_AND_ADD),
            6,
        ),
        (SendOp::LocalInv { key: 4 }, Some(IBV_WR_LOCAL_INV), 7),
        (SendOp::BindMw { mw: &mw, rkey: 5, bind }, Some(IBV_WR_BIND_MW), 8),
        (SendOp::SendWithInv { rkey: 6 }, Some(IBV_WR_SEND_WITH_INV), 9),
    ];
    for (op, raw, number) in table {
        assert_eq!(send_opcode(&op), raw, "{op:?}");
        assert_eq!(raw, Some(number), "verbs.h numbering of {op:?}");
    }
    let reg = SendOp::RegMr {
        mr: &mr,
        key: 1,
        access: AccessFlags::empty(),
    };
    assert_eq!(send_opcode(&reg), None, "no REG_MR work request in user space");
}
