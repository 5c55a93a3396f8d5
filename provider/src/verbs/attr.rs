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
