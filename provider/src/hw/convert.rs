//! Conversions between the API's types and `verbs.h`.
//!
//! The API's enums and flags carry the numeric values of rdma-core's
//! `verbs.h` (see [`crate::verbs::types`]), so most conversions are by
//! value; the tests below check every one against the constants bindgen
//! generated from the installed headers. Where the device may report a
//! value the API cannot represent, the choice made is documented on the
//! function.

use std::os::raw::{c_char, c_int};

use rdma_sys::{
    ibv_ah_attr, ibv_device_attr, ibv_gid, ibv_global_route, ibv_port_attr, ibv_qp_attr, ibv_qp_cap, ibv_srq_attr,
    ibv_wc, ibv_wr_opcode,
};

use super::ffi::{zeroed, IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_UNSPECIFIED};
use crate::verbs::*;

/// A number the device reported that the API has no value for.
fn unknown(verb: Verb, what: &str, raw: u32) -> Error {
    Error::new(
        verb,
        ErrorKind::Io,
        format!("the device reported an unknown {what} ({raw})"),
    )
}

/// A count the device reports as a C `int` (never negative in practice).
fn count(v: c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// A NUL-terminated C string in a fixed array.
fn c_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A `__be64` GUID as the API's host-order [`Guid`].
pub(crate) fn guid_from_raw(be: u64) -> Guid {
    Guid(u64::from_be(be))
}

/// `union ibv_gid` from a [`Gid`] (both are 16 bytes in network order).
pub(crate) fn gid_to_raw(gid: Gid) -> ibv_gid {
    ibv_gid { raw: gid.0 }
}

/// A [`Gid`] from `union ibv_gid`.
pub(crate) fn gid_from_raw(gid: &ibv_gid) -> Gid {
    // SAFETY: every member of the union is 16 bytes of plain data.
    Gid(unsafe { gid.raw })
}

/// `struct ibv_device_attr` as [`DeviceAttr`]. `ibv_query_device` does not
/// report a fast-registration page list (user space has no fast
/// registration) nor a maximum inline size (granted per QP at creation):
/// both are 0. Unknown capability bits are kept.
pub(crate) fn device_attr_from_raw(a: &ibv_device_attr) -> DeviceAttr {
    DeviceAttr {
        fw_ver: c_string(&a.fw_ver),
        node_guid: guid_from_raw(a.node_guid),
        sys_image_guid: guid_from_raw(a.sys_image_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: count(a.max_qp),
        max_qp_wr: count(a.max_qp_wr),
        device_cap_flags: DeviceCapFlags::from_bits_retain(u64::from(a.device_cap_flags)),
        max_sge: count(a.max_sge),
        max_sge_rd: count(a.max_sge_rd),
        max_cq: count(a.max_cq),
        max_cqe: count(a.max_cqe),
        max_mr: count(a.max_mr),
        max_pd: count(a.max_pd),
        max_qp_rd_atom: count(a.max_qp_rd_atom),
        max_res_rd_atom: count(a.max_res_rd_atom),
        max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
        atomic_cap: AtomicCap::from_raw(a.atomic_cap),
        max_mw: count(a.max_mw),
        max_ah: count(a.max_ah),
        max_srq: count(a.max_srq),
        max_srq_wr: count(a.max_srq_wr),
        max_srq_sge: count(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
        max_fast_reg_page_list_len: 0,
        max_inline_data: 0,
    }
}

/// `struct ibv_port_attr` as [`PortAttr`].
///
/// # Errors
///
/// `EIO` for a port state or MTU outside `verbs.h`. An unknown link layer
/// reads as [`LinkLayer::Unspecified`].
pub(crate) fn port_attr_from_raw(a: &ibv_port_attr) -> Result<PortAttr> {
    let state = PortState::from_raw(a.state).ok_or_else(|| unknown(Verb::QueryPort, "port state", a.state))?;
    let max_mtu = Mtu::from_raw(a.max_mtu).ok_or_else(|| unknown(Verb::QueryPort, "max MTU", a.max_mtu))?;
    let active_mtu = Mtu::from_raw(a.active_mtu).ok_or_else(|| unknown(Verb::QueryPort, "active MTU", a.active_mtu))?;
    Ok(PortAttr {
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len: count(a.gid_tbl_len),
        port_cap_flags: a.port_cap_flags,
        max_msg_sz: a.max_msg_sz,
        bad_pkey_cntr: a.bad_pkey_cntr,
        qkey_viol_cntr: a.qkey_viol_cntr,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        sm_lid: a.sm_lid,
        lmc: a.lmc,
        max_vl_num: a.max_vl_num,
        sm_sl: a.sm_sl,
        subnet_timeout: a.subnet_timeout,
        active_width: a.active_width,
        active_speed: a.active_speed,
        phys_state: a.phys_state,
        link_layer: link_layer_from_raw(a.link_layer),
    })
}

/// `IBV_LINK_LAYER_*` as [`LinkLayer`]; an unknown value is unspecified.
pub(crate) fn link_layer_from_raw(raw: u8) -> LinkLayer {
    match raw {
        IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
        IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
        IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::Unspecified,
        _ => LinkLayer::Unspecified,
    }
}

/// [`AhAttr`] as `struct ibv_ah_attr`.
pub(crate) fn ah_attr_to_raw(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: gid_to_raw(a.grh.dgid),
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `struct ibv_ah_attr` as [`AhAttr`].
pub(crate) fn ah_attr_from_raw(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: gid_from_raw(&a.grh.dgid),
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

/// [`QpCap`] as `struct ibv_qp_cap`.
pub(crate) fn qp_cap_to_raw(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `struct ibv_qp_cap` as [`QpCap`].
pub(crate) fn qp_cap_from_raw(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpAttr`] as `struct ibv_qp_attr` (every field; the mask says which
/// the device reads).
pub(crate) fn qp_attr_to_raw(a: &QpAttr) -> ibv_qp_attr {
    let mut r: ibv_qp_attr = zeroed();
    r.qp_state = a.qp_state.as_raw();
    r.cur_qp_state = a.cur_qp_state.as_raw();
    r.path_mtu = a.path_mtu.as_raw();
    r.path_mig_state = a.path_mig_state.as_raw();
    r.qkey = a.qkey;
    r.rq_psn = a.rq_psn;
    r.sq_psn = a.sq_psn;
    r.dest_qp_num = a.dest_qp_num;
    r.qp_access_flags = access_to_raw(a.qp_access_flags);
    r.cap = qp_cap_to_raw(&a.cap);
    r.ah_attr = ah_attr_to_raw(&a.ah_attr);
    r.alt_ah_attr = ah_attr_to_raw(&a.alt_ah_attr);
    r.pkey_index = a.pkey_index;
    r.alt_pkey_index = a.alt_pkey_index;
    r.en_sqd_async_notify = u8::from(a.en_sqd_async_notify);
    r.sq_draining = u8::from(a.sq_draining);
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.port_num = a.port_num;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    r.alt_port_num = a.alt_port_num;
    r.alt_timeout = a.alt_timeout;
    r.rate_limit = a.rate_limit;
    r
}

/// `struct ibv_qp_attr` (as `ibv_query_qp` fills it) as [`QpAttr`].
///
/// A path MTU of 0 (a QP never moved to RTR reports none) or any other
/// value outside `verbs.h` reads as the API's default, 1024; likewise an
/// unknown migration state reads as `MIGRATED`.
///
/// # Errors
///
/// `EIO` for a QP state outside `verbs.h` (`IBV_QPS_UNKNOWN`).
pub(crate) fn qp_attr_from_raw(r: &ibv_qp_attr) -> Result<QpAttr> {
    let qp_state = QpState::from_raw(r.qp_state).ok_or_else(|| unknown(Verb::QueryQp, "QP state", r.qp_state))?;
    let defaults = QpAttr::default();
    Ok(QpAttr {
        qp_state,
        cur_qp_state: QpState::from_raw(r.cur_qp_state).unwrap_or(qp_state),
        path_mtu: Mtu::from_raw(r.path_mtu).unwrap_or(defaults.path_mtu),
        path_mig_state: MigState::from_raw(r.path_mig_state).unwrap_or(defaults.path_mig_state),
        qkey: r.qkey,
        rq_psn: r.rq_psn,
        sq_psn: r.sq_psn,
        dest_qp_num: r.dest_qp_num,
        qp_access_flags: access_from_raw(r.qp_access_flags),
        cap: qp_cap_from_raw(&r.cap),
        ah_attr: ah_attr_from_raw(&r.ah_attr),
        alt_ah_attr: ah_attr_from_raw(&r.alt_ah_attr),
        pkey_index: r.pkey_index,
        alt_pkey_index: r.alt_pkey_index,
        en_sqd_async_notify: r.en_sqd_async_notify != 0,
        sq_draining: r.sq_draining != 0,
        max_rd_atomic: r.max_rd_atomic,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        port_num: r.port_num,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
        alt_port_num: r.alt_port_num,
        alt_timeout: r.alt_timeout,
        rate_limit: r.rate_limit,
    })
}

/// [`QpAttrMask`] as the `int attr_mask` of `ibv_modify_qp`.
pub(crate) fn qp_attr_mask_to_raw(m: QpAttrMask) -> c_int {
    // The highest bit verbs.h defines is 1 << 25: the value fits.
    m.bits() as c_int
}

/// The `attr_mask` of `ibv_modify_qp`/`ibv_query_qp` as [`QpAttrMask`]
/// (unknown bits kept).
#[cfg(test)]
pub(crate) fn qp_attr_mask_from_raw(m: c_int) -> QpAttrMask {
    QpAttrMask::from_bits_retain(m as u32)
}

/// [`SrqAttr`] as `struct ibv_srq_attr`.
pub(crate) fn srq_attr_to_raw(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `struct ibv_srq_attr` as [`SrqAttr`].
pub(crate) fn srq_attr_from_raw(a: &ibv_srq_attr) -> SrqAttr {
    SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// [`SrqAttrMask`] as the `int` of `ibv_modify_srq`.
pub(crate) fn srq_attr_mask_to_raw(m: SrqAttrMask) -> c_int {
    m.bits() as c_int
}

/// [`AccessFlags`] as `enum ibv_access_flags` bits.
pub(crate) fn access_to_raw(a: AccessFlags) -> u32 {
    a.bits()
}

/// `enum ibv_access_flags` bits as [`AccessFlags`] (unknown bits kept).
pub(crate) fn access_from_raw(raw: u32) -> AccessFlags {
    AccessFlags::from_bits_retain(raw)
}

/// [`SendFlags`] as `enum ibv_send_flags` bits.
pub(crate) fn send_flags_to_raw(f: SendFlags) -> u32 {
    f.bits()
}

/// [`ReregFlags`] as `enum ibv_rereg_mr_flags` bits.
pub(crate) fn rereg_flags_to_raw(f: ReregFlags) -> c_int {
    f.bits() as c_int
}

/// Immediate data as `ibv_send_wr.imm_data` (`__be32`) from the API's
/// host-order value.
pub(crate) fn imm_to_raw(host: u32) -> u32 {
    host.to_be()
}

/// The API's host-order immediate value from `ibv_wc.imm_data` (`__be32`).
pub(crate) fn imm_from_raw(be: u32) -> u32 {
    u32::from_be(be)
}

/// The `enum ibv_wr_opcode` of a send operation; `None` for
/// [`SendOp::RegMr`], which user-space ibverbs does not have.
pub(crate) fn send_opcode(op: &SendOp<'_>) -> Option<u32> {
    Some(match op {
        SendOp::Send => ibv_wr_opcode::IBV_WR_SEND,
        SendOp::SendWithImm { .. } => ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        SendOp::SendWithInv { .. } => ibv_wr_opcode::IBV_WR_SEND_WITH_INV,
        SendOp::Write { .. } => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        SendOp::WriteWithImm { .. } => ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        SendOp::Read { .. } => ibv_wr_opcode::IBV_WR_RDMA_READ,
        SendOp::CompareSwap { .. } => ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
        SendOp::FetchAdd { .. } => ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
        SendOp::LocalInv { .. } => ibv_wr_opcode::IBV_WR_LOCAL_INV,
        SendOp::BindMw { .. } => ibv_wr_opcode::IBV_WR_BIND_MW,
        SendOp::RegMr { .. } => return None,
    })
}

/// `enum ibv_wc_status` as [`WcStatus`]; a status newer than the API reads
/// as [`WcStatus::GeneralErr`] (the raw number is lost; `vendor_err` is
/// kept).
pub(crate) fn wc_status_from_raw(raw: u32) -> WcStatus {
    WcStatus::from_raw(raw).unwrap_or(WcStatus::GeneralErr)
}

/// `enum ibv_wc_opcode` as [`WcOpcode`], if the API has it (not TSO,
/// ATOMIC_WRITE, tag matching or driver opcodes, none of which this
/// backend posts).
pub(crate) fn wc_opcode_from_raw(raw: u32) -> Option<WcOpcode> {
    WcOpcode::from_raw(raw)
}

/// `struct ibv_wc` as [`WorkCompletion`].
///
/// With `WITH_IMM` the immediate data is converted from network order to
/// the host-order value; with `WITH_INV` the union holds the invalidated
/// rkey, already in host order; with neither, `imm_data` is 0. An opcode
/// the API lacks (only possible in an error completion, where the opcode
/// is undefined) reads as [`WcOpcode::Send`].
#[inline]
pub(crate) fn wc_from_raw(w: &ibv_wc) -> WorkCompletion {
    let wc_flags = WcFlags::from_bits_truncate(w.wc_flags);
    // SAFETY: both members of the union are a u32.
    let raw = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
    let imm_data = if wc_flags.contains(WcFlags::WITH_IMM) {
        imm_from_raw(raw)
    } else if wc_flags.contains(WcFlags::WITH_INV) {
        raw
    } else {
        0
    };
    WorkCompletion {
        wr_id: w.wr_id,
        status: wc_status_from_raw(w.status),
        opcode: wc_opcode_from_raw(w.opcode).unwrap_or(WcOpcode::Send),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// Which member of `ibv_async_event.element` an event type uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventSubject {
    /// None: the device as a whole.
    Device,
    /// `port_num`.
    Port,
    /// `qp`.
    Qp,
    /// `cq`.
    Cq,
    /// `srq`.
    Srq,
    /// `wq` (this backend creates no WQs; reported as a device event).
    Wq,
}

/// `enum ibv_event_type` as [`EventType`] and the member of the element
/// union it refers to (per `ibv_get_async_event(3)`); `None` for a type
/// newer than the API.
pub(crate) fn event_from_raw(raw: u32) -> Option<(EventType, EventSubject)> {
    use EventType::*;
    let ty = EventType::from_raw(raw)?;
    let subject = match ty {
        CqErr => EventSubject::Cq,
        QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr | QpLastWqeReached => {
            EventSubject::Qp
        }
        SrqErr | SrqLimitReached => EventSubject::Srq,
        PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister | GidChange => EventSubject::Port,
        DeviceFatal => EventSubject::Device,
        WqFatal => EventSubject::Wq,
    };
    Some((ty, subject))
}

#[cfg(test)]
mod tests;
