//! Enumerations, flags and small value types of the verbs interface, with the
//! numeric values of rdma-core's `verbs.h` so that backends convert by value.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bitflags::bitflags;

/// Generates an enum with explicit `verbs.h` values, `as_raw`/`from_raw`
/// conversions and printable names.
macro_rules! verbs_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident : $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in `verbs.h` order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The numeric value used by `verbs.h`.
            pub const fn as_raw(self) -> $raw {
                match self { $($name::$variant => $value,)+ }
            }

            /// The value for a `verbs.h` number, if it is one.
            pub const fn from_raw(raw: $raw) -> Option<Self> {
                match raw { $(x if x == $value => Some($name::$variant),)+ _ => None }
            }

            /// The `verbs.h`-style name (as `ibv_*_str` prints it).
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

verbs_enum! {
    /// Queue pair transport type (`enum ibv_qp_type`).
    pub enum QpType: u32 {
        /// Reliable connected.
        Rc = 2 => "RC",
        /// Unreliable connected.
        Uc = 3 => "UC",
        /// Unreliable datagram.
        Ud = 4 => "UD",
    }
}

verbs_enum! {
    /// Queue pair state (`enum ibv_qp_state`).
    pub enum QpState: u32 {
        /// Just created or reset: no traffic, queues empty.
        Reset = 0 => "RESET",
        /// Initialised: receives may be posted.
        Init = 1 => "INIT",
        /// Ready to receive.
        Rtr = 2 => "RTR",
        /// Ready to send.
        Rts = 3 => "RTS",
        /// Send queue drain.
        Sqd = 4 => "SQD",
        /// Send queue error (UD/UC only; entered by the device).
        Sqe = 5 => "SQE",
        /// Error: everything flushes.
        Err = 6 => "ERR",
    }
}

verbs_enum! {
    /// Path MTU (`enum ibv_mtu`).
    pub enum Mtu: u32 {
        /// 256 bytes.
        Mtu256 = 1 => "256",
        /// 512 bytes.
        Mtu512 = 2 => "512",
        /// 1024 bytes.
        Mtu1024 = 3 => "1024",
        /// 2048 bytes.
        Mtu2048 = 4 => "2048",
        /// 4096 bytes.
        Mtu4096 = 5 => "4096",
    }
}

impl Mtu {
    /// The MTU in bytes.
    pub const fn bytes(self) -> u32 {
        128 << self.as_raw()
    }

    /// The largest MTU not above `bytes`, if `bytes` ≥ 256.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.iter().rev().copied().find(|m| m.bytes() <= bytes)
    }
}

verbs_enum! {
    /// Port state (`enum ibv_port_state`).
    pub enum PortState: u32 {
        /// No state change.
        Nop = 0 => "PORT_NOP",
        /// Link down.
        Down = 1 => "PORT_DOWN",
        /// Link up, not yet configured.
        Init = 2 => "PORT_INIT",
        /// Armed.
        Armed = 3 => "PORT_ARMED",
        /// Active: traffic flows.
        Active = 4 => "PORT_ACTIVE",
        /// Active, deferred.
        ActiveDefer = 5 => "PORT_ACTIVE_DEFER",
    }
}

verbs_enum! {
    /// Link layer of a port.
    pub enum LinkLayer: u8 {
        /// Unspecified.
        Unspecified = 0 => "Unspecified",
        /// InfiniBand.
        InfiniBand = 1 => "InfiniBand",
        /// Ethernet (RoCE, iWARP, and the soft provider).
        Ethernet = 2 => "Ethernet",
    }
}

verbs_enum! {
    /// Atomic guarantees of a device (`enum ibv_atomic_cap`).
    pub enum AtomicCap: u32 {
        /// No atomics.
        None = 0 => "ATOMIC_NONE",
        /// Atomic only with respect to this HCA's own atomics.
        Hca = 1 => "ATOMIC_HCA",
        /// Atomic with respect to CPU and other HCAs too.
        Glob = 2 => "ATOMIC_GLOB",
    }
}

verbs_enum! {
    /// Memory window type (`enum ibv_mw_type`).
    pub enum MwType: u32 {
        /// Type 1: bound by the `bind_mw` verb.
        Type1 = 1 => "MW_TYPE_1",
        /// Type 2: bound by a BIND_MW work request.
        Type2 = 2 => "MW_TYPE_2",
    }
}

verbs_enum! {
    /// Work completion status (`enum ibv_wc_status`), every value.
    pub enum WcStatus: u32 {
        /// Success.
        Success = 0 => "success",
        /// Local length error.
        LocLenErr = 1 => "local length error",
        /// Local QP operation error.
        LocQpOpErr = 2 => "local QP operation error",
        /// Local EE context operation error.
        LocEecOpErr = 3 => "local EE context operation error",
        /// Local protection error.
        LocProtErr = 4 => "local protection error",
        /// Work request flushed.
        WrFlushErr = 5 => "Work Request Flushed Error",
        /// Memory window bind error.
        MwBindErr = 6 => "memory management operation error",
        /// Bad response.
        BadRespErr = 7 => "bad response error",
        /// Local access error.
        LocAccessErr = 8 => "local access error",
        /// Remote invalid request.
        RemInvReqErr = 9 => "remote invalid request error",
        /// Remote access error.
        RemAccessErr = 10 => "remote access error",
        /// Remote operation error.
        RemOpErr = 11 => "remote operation error",
        /// Transport retry counter exceeded.
        RetryExcErr = 12 => "transport retry counter exceeded",
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13 => "RNR retry counter exceeded",
        /// Local RDD violation.
        LocRddViolErr = 14 => "local RDD violation error",
        /// Remote invalid RD request.
        RemInvRdReqErr = 15 => "remote invalid RD request",
        /// Remote aborted.
        RemAbortErr = 16 => "aborted error",
        /// Invalid EE context number.
        InvEecnErr = 17 => "invalid EE context number",
        /// Invalid EE context state.
        InvEecStateErr = 18 => "invalid EE context state",
        /// Fatal error.
        FatalErr = 19 => "fatal error",
        /// Response timeout.
        RespTimeoutErr = 20 => "response timeout error",
        /// General error.
        GeneralErr = 21 => "general error",
        /// Tag matching error.
        TmErr = 22 => "TM error",
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = 23 => "TM software rendezvous",
    }
}

verbs_enum! {
    /// What a work completion completed (`enum ibv_wc_opcode`, plus the
    /// kernel's REG_MR, which userspace ibverbs lacks).
    pub enum WcOpcode: u32 {
        /// Send (any send flavour).
        Send = 0 => "SEND",
        /// RDMA write (with or without immediate).
        RdmaWrite = 1 => "RDMA_WRITE",
        /// RDMA read.
        RdmaRead = 2 => "RDMA_READ",
        /// Atomic compare and swap.
        CompSwap = 3 => "COMP_SWAP",
        /// Atomic fetch and add.
        FetchAdd = 4 => "FETCH_ADD",
        /// Memory window bind.
        BindMw = 5 => "BIND_MW",
        /// Local invalidate.
        LocalInv = 6 => "LOCAL_INV",
        /// Fast registration (REG_MR work request; kernel `IB_WC_REG_MR`).
        RegMr = 10 => "REG_MR",
        /// A receive consumed by a send.
        Recv = 128 => "RECV",
        /// A receive consumed by an RDMA write with immediate.
        RecvRdmaWithImm = 129 => "RECV_RDMA_WITH_IMM",
    }
}

verbs_enum! {
    /// Asynchronous event type (`enum ibv_event_type`).
    pub enum EventType: u32 {
        /// CQ overrun or access error; the CQ is unusable.
        CqErr = 0 => "CQ error",
        /// QP fatal error.
        QpFatal = 1 => "local work queue catastrophic error",
        /// Invalid request on a QP.
        QpReqErr = 2 => "invalid request local work queue error",
        /// Access violation on a QP.
        QpAccessErr = 3 => "local access violation work queue error",
        /// Communication established.
        CommEst = 4 => "communication established",
        /// Send queue drained (SQD).
        SqDrained = 5 => "send queue drained",
        /// Path migrated.
        PathMig = 6 => "path migrated",
        /// Path migration failed.
        PathMigErr = 7 => "path migration request error",
        /// The device is gone or broken: the last event of a device.
        DeviceFatal = 8 => "local catastrophic error",
        /// Port became active.
        PortActive = 9 => "port active",
        /// Port left the active state.
        PortErr = 10 => "port error",
        /// LID changed.
        LidChange = 11 => "LID change",
        /// P_Key table changed.
        PkeyChange = 12 => "P_Key change",
        /// Subnet manager changed.
        SmChange = 13 => "SM change",
        /// SRQ catastrophic error.
        SrqErr = 14 => "SRQ catastrophic error",
        /// SRQ dropped below its limit.
        SrqLimitReached = 15 => "SRQ limit reached",
        /// Last WQE reached on a QP attached to an SRQ.
        QpLastWqeReached = 16 => "last WQE reached",
        /// Client reregister.
        ClientReregister = 17 => "client reregistration",
        /// GID table changed.
        GidChange = 18 => "GID table change",
        /// WQ fatal.
        WqFatal = 19 => "WQ fatal",
    }
}

verbs_enum! {
    /// Automatic path migration state (`enum ibv_mig_state`).
    pub enum MigState: u32 {
        /// Migrated.
        Migrated = 0 => "MIGRATED",
        /// Rearm.
        Rearm = 1 => "REARM",
        /// Armed.
        Armed = 2 => "ARMED",
    }
}

bitflags! {
    /// Memory access rights (`enum ibv_access_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local device may write (receives, read responses).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read.
        const REMOTE_READ = 1 << 2;
        /// Peers may perform atomics.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to this MR.
        const MW_BIND = 1 << 4;
        /// Addresses are offsets from the MR start.
        const ZERO_BASED = 1 << 5;
        /// On-demand paging.
        const ON_DEMAND = 1 << 6;
        /// Huge pages.
        const HUGETLB = 1 << 7;
        /// Relaxed ordering.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// Any remote right (the MR then has an rkey).
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// The registration rule of docs/design.md §3.1 / `ibv_reg_mr(3)`: remote write
    /// or remote atomic require local write.
    pub fn is_valid_for_mr(self) -> bool {
        self.contains(AccessFlags::LOCAL_WRITE)
            || !self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
    }
}

bitflags! {
    /// Send work request flags (`enum ibv_send_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA reads and atomics to complete first.
        const FENCE = 1;
        /// Generate a completion on success.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit.
        const SOLICITED = 1 << 2;
        /// Copy the data at post time (Send and RDMA Write only).
        const INLINE = 1 << 3;
        /// IP checksum offload (raw packet QPs; rejected here).
        const IP_CSUM = 1 << 4;
    }
}

bitflags! {
    /// Work completion flags (`enum ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH is present (UD receive).
        const GRH = 1;
        /// Immediate data is valid.
        const WITH_IMM = 1 << 1;
        /// IP checksum verified.
        const IP_CSUM_OK = 1 << 2;
        /// The completion invalidated an rkey (send with invalidate).
        const WITH_INV = 1 << 3;
    }
}

bitflags! {
    /// Which attributes a `modify_qp` / `query_qp` concerns
    /// (`enum ibv_qp_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr` (the primary address vector).
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit`.
        const RATE_LIMIT = 1 << 25;
    }
}

bitflags! {
    /// Which SRQ attributes a `modify_srq` changes (`enum ibv_srq_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize (`max_wr`).
        const MAX_WR = 1;
        /// Arm the limit event (`srq_limit`).
        const LIMIT = 1 << 1;
    }
}

bitflags! {
    /// What `rereg_mr` changes (`enum ibv_rereg_mr_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ReregFlags: u32 {
        /// New address range.
        const CHANGE_TRANSLATION = 1;
        /// New protection domain.
        const CHANGE_PD = 1 << 1;
        /// New access rights.
        const CHANGE_ACCESS = 1 << 2;
    }
}

bitflags! {
    /// Device capabilities (`enum ibv_device_cap_flags`, same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlags: u64 {
        /// Resizing a queue's max WR is supported.
        const RESIZE_MAX_WR = 1;
        /// Bad P_Key counter.
        const BAD_PKEY_CNTR = 1 << 1;
        /// Bad Q_Key counter.
        const BAD_QKEY_CNTR = 1 << 2;
        /// Automatic path migration.
        const AUTO_PATH_MIG = 1 << 4;
        /// Modify QP accepts the current-state attribute.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// Port active event.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// System image GUID is valid.
        const SYS_IMAGE_GUID = 1 << 11;
        /// RC RNR NAK generation.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// SRQ resize.
        const SRQ_RESIZE = 1 << 13;
        /// Solicited/next notification on CQs.
        const N_NOTIFY_CQ = 1 << 14;
        /// Memory windows.
        const MEM_WINDOW = 1 << 17;
        /// Memory management extensions (fast registration, local
        /// invalidate, send with invalidate).
        const MEM_MGT_EXTENSIONS = 1 << 21;
        /// Memory window type 2A.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// Memory window type 2B.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
    }
}

/// A 16-byte global identifier. For RoCEv2 it is an IPv6 address or an
/// IPv4-mapped one (`::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty table slot).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The standard RoCEv2 GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID names (IPv4 for a mapped GID).
    #[inline]
    pub fn to_ip(self) -> IpAddr {
        // The mapped-prefix test on one 128-bit word (its top 96 bits):
        // the engine calls this for every packet, and
        // `Ipv6Addr::to_ipv4_mapped` went through eight 16-bit segments.
        let w = u128::from_be_bytes(self.0);
        if w >> 32 == 0xffff {
            // The low 32 bits are the IPv4 address.
            IpAddr::V4(Ipv4Addr::from(w as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(w))
        }
    }

    /// The subnet prefix (upper 8 bytes, big-endian).
    pub fn subnet_prefix(self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The interface id (lower 8 bytes, big-endian).
    pub fn interface_id(self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    /// Whether this is the all-zero GID.
    pub fn is_zero(self) -> bool {
        self == Gid::ZERO
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(ip: Ipv6Addr) -> Gid {
        Gid::from_ip(IpAddr::V6(ip))
    }
}

impl fmt::Display for Gid {
    /// `ibv_devinfo -v` style: eight groups of four hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;

    /// Parses either the eight-group form or any IP address.
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        let ip: IpAddr = s.parse()?;
        Ok(Gid::from_ip(ip))
    }
}

/// A 64-bit GUID printed as `ibv_devices` does (four groups of four hex
/// digits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Guid(pub u64);

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0.to_be_bytes();
        write!(
            f,
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_match_verbs_h() {
        assert_eq!(WcStatus::RetryExcErr.as_raw(), 12);
        assert_eq!(WcStatus::from_raw(5), Some(WcStatus::WrFlushErr));
        assert_eq!(WcStatus::ALL.len(), 24);
        assert_eq!(QpState::from_raw(6), Some(QpState::Err));
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::MAX_DEST_RD_ATOMIC.bits(), 131072);
        assert_eq!(EventType::SrqLimitReached.as_raw(), 15);
        assert_eq!(WcOpcode::RecvRdmaWithImm.as_raw(), 129);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(100), None);
    }

    #[test]
    fn mr_access_rule() {
        assert!(AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_WRITE)
            .is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_WRITE.is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_ATOMIC.is_valid_for_mr());
        assert!(AccessFlags::REMOTE_READ.is_valid_for_mr());
        assert!(AccessFlags::empty().is_valid_for_mr());
    }

    #[test]
    fn gid_forms() {
        let g: Gid = "10.0.0.7".parse().unwrap();
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:0007");
        assert_eq!(g.to_ip(), "10.0.0.7".parse::<IpAddr>().unwrap());
        let g6: Gid = "fe80::1".parse().unwrap();
        assert_eq!(g6.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g6.interface_id(), 1);
        assert_eq!(Guid(0x0002_c903_0001_0203).to_string(), "0002:c903:0001:0203");
        // `to_ip` against std's reading of the mapped prefix, including
        // addresses that differ from it in one part only.
        for a in [
            "::ffff:10.0.0.7",
            "::ffff:0.0.0.0",
            "::1",
            "::",
            "::fffe:10.0.0.7",
            "::1:ffff:10.0.0.7",
            "1::ffff:10.0.0.7",
            "fe80::ffff:10.0.0.7",
            "ff00::",
        ] {
            let v6: std::net::Ipv6Addr = a.parse().unwrap();
            let want = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            assert_eq!(Gid(v6.octets()).to_ip(), want, "{a}");
        }
    }
}
