//! The QP state machine of `modify_qp` (docs/design.md §3.2): which transitions are
//! legal for each transport, which attributes each one requires and allows,
//! and the value checks a device applies to them. Pure and backend-neutral:
//! the soft provider calls [`check_modify`] then [`apply_modify`]
//! (check-then-apply, so an invalid modify changes nothing), and the
//! conformance suite uses [`transition`] to enumerate the table.
//!
//! # Sources
//!
//! - The masks are the kernel's `qp_state_table` (drivers/infiniband/core/
//!   verbs.c, checked by `ib_modify_qp_is_ok`), which encodes the Modify QP
//!   verb of IBTA Vol. 1 ch. 11 and the QP state diagram of ch. 10. Every
//!   hardware provider (mlx5 included) calls `ib_modify_qp_is_ok` first.
//! - The value checks follow what `ibv_modify_qp` meets on its way to the
//!   device: uverbs `modify_qp()` (drivers/infiniband/core/uverbs_cmd.c:
//!   port numbers, controlled Q_Keys, unknown mask bits), `_ib_modify_qp()`
//!   (verbs.c: source GID lookup, no alternate path on RoCE, PSNs masked to
//!   24 bits) and `mlx5_ib_modify_qp()` (P_Key index, RDMA read/atomic
//!   depths, GRH required on RoCE); field widths are those of IBTA.
//!
//! # Decisions where the sources leave room
//!
//! - **RC SQE→RTS is illegal.** The kernel's `valid` flag is per state pair,
//!   not per transport, and its SQE→RTS row lists masks only for UD, UC and
//!   the special QPs, so `ib_modify_qp_is_ok` would pass an RC QP with a
//!   bare STATE. But an RC QP never is in SQE (IBTA QP states: send errors
//!   on a reliable connection take the QP to ERR; only UD/UC enter SQE), and
//!   the only way to claim SQE, CUR_STATE, is not in RC's (empty) optional
//!   mask, so no RC QP on hardware can make this transition. We report it as
//!   illegal; the design table (`docs/design.md` §3.2)'s "– / –" means the same.
//! - **A modify without the STATE bit** is an attribute-only modify in the
//!   current state: it uses the same-state row (RTS→RTS, INIT→INIT, …), as
//!   mlx5 does (`new_state = cur_state` when STATE is absent). So it works
//!   where that row exists (RESET, INIT, RTS, SQD, ERR) with that row's
//!   optional attributes, and an empty mask in RESET is a legal no-op.
//! - **Access flags are not range-checked.** Neither the kernel nor mlx5 nor
//!   rxe validates `qp_access_flags`: mlx5 keeps REMOTE_READ/WRITE/ATOMIC and
//!   ignores every other bit (LOCAL_WRITE, MW_BIND, …), so rejecting them
//!   here would fail programs that run on hardware. They are stored as given.
//! - **PSNs over 24 bits are masked, not rejected**, as `_ib_modify_qp`
//!   does ("sq_psn overflow, masking to 24 bits"): many programs pass
//!   `lrand48()` as a PSN. `dest_qp_num` over 24 bits is EINVAL (drivers
//!   truncate it silently; a 25-bit QPN is always a bug).
//! - **Unpopulated source GID: ENODATA**, as `rdma_get_gid_attr` returns
//!   since Linux 5.10 (an index past the table is EINVAL).
//! - **RESET** clears every attribute to its default except `cap` (queue
//!   sizes are fixed at creation), as IBTA describes the Reset state.
//!
//! Checks run in the kernel's order, so with several faults the one reported
//! has the errno the kernel would return: unknown mask bits (EOPNOTSUPP),
//! port numbers, controlled Q_Key (EPERM), source GIDs, the state table,
//! then attribute values.

use super::attr::{AhAttr, DeviceAttr, PortAttr, QpAttr};
use super::error::{Error, ErrorKind, Result, Verb};
use super::types::{LinkLayer, Mtu, QpAttrMask, QpState, QpType};

/// What a transition requires and allows, beside the implied STATE bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionMasks {
    /// Attributes that must be in the mask.
    pub required: QpAttrMask,
    /// Attributes that may be in the mask.
    pub optional: QpAttrMask,
}

impl TransitionMasks {
    /// Every bit a modify making this transition may carry: required,
    /// optional and STATE.
    pub fn allowed(self) -> QpAttrMask {
        self.required | self.optional | QpAttrMask::STATE
    }
}

/// The legal transition `from`→`to` of a `qp_type` QP and its attribute
/// masks (kernel `qp_state_table`, docs/design.md §3.2), or `None` if illegal.
///
/// STATE is implied for a state change and not listed; a modify without
/// STATE uses the `from`→`from` row. CUR_STATE is listed in `optional`
/// where the table allows it.
pub fn transition(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionMasks> {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Rc, Uc, Ud};
    type M = QpAttrMask;
    let none = M::empty();
    let row = |required, optional| Some(TransitionMasks { required, optional });
    // Connected transports (UC, RC) take access flags where UD takes a Q_Key.
    let init_attrs = match qp_type {
        Ud => M::PKEY_INDEX | M::PORT | M::QKEY,
        Uc | Rc => M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    };
    // Optional attributes of every transition into RTS but SQE→RTS.
    let to_rts_opt = match qp_type {
        Ud => M::CUR_STATE | M::QKEY,
        Uc => M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
        Rc => M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
    };
    // The RC requester's path parameters.
    let rc_path = M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    let uc_sqd = M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE;
    match (from, to) {
        (Reset, Reset) => row(none, none),
        (Reset, Init) => row(init_attrs, none),
        // RESET→ERR is not in the kernel table: a QP must be initialised first.
        (Reset, _) => None,
        (_, Reset | Err) => row(none, none),
        (Init, Init) => row(none, init_attrs),
        (Init, Rtr) => {
            let connect = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            let opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
            match qp_type {
                Ud => row(none, M::PKEY_INDEX | M::QKEY),
                Uc => row(connect, opt),
                Rc => row(connect | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER, opt),
            }
        }
        (Rtr, Rts) => match qp_type {
            Ud | Uc => row(M::SQ_PSN, to_rts_opt),
            Rc => row(M::SQ_PSN | rc_path, to_rts_opt),
        },
        (Rts | Sqd, Rts) => row(none, to_rts_opt),
        (Rts, Sqd) => row(none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Ud => row(none, M::PKEY_INDEX | M::QKEY),
            Uc => row(none, uc_sqd),
            Rc => row(
                none,
                uc_sqd | M::PORT | rc_path | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
            ),
        },
        // Only UD and UC enter SQE; see the module documentation for RC.
        (Sqe, Rts) => match qp_type {
            Ud => row(none, M::CUR_STATE | M::QKEY),
            Uc => row(none, M::CUR_STATE | M::ACCESS_FLAGS),
            Rc => None,
        },
        _ => None,
    }
}

/// The device and QP facts [`check_modify`] checks attribute values
/// against. Build it with [`ModifyLimits::new`] from the device and port
/// attributes, then mark the populated GID slots (they change at run time
/// with the host's addresses) and set `qp_port`.
///
/// One port's limits stand for all ports (every port of a device has the
/// same tables here; soft devices have one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyLimits {
    /// Number of ports; valid port numbers are `1..=phys_port_cnt`.
    pub phys_port_cnt: u8,
    /// The port's link layer: on Ethernet (RoCE) an address vector needs a
    /// GRH and alternate paths are refused.
    pub link_layer: LinkLayer,
    /// P_Key table length; `pkey_index` and `alt_pkey_index` must be below.
    pub pkey_tbl_len: u16,
    /// Largest `path_mtu` (the port's `max_mtu`).
    pub max_mtu: Mtu,
    /// Largest `max_dest_rd_atomic` (device `max_qp_rd_atom`: reads and
    /// atomics outstanding per QP as responder).
    pub max_qp_rd_atom: u32,
    /// Largest `max_rd_atomic` (device `max_qp_init_rd_atom`: as initiator).
    pub max_qp_init_rd_atom: u32,
    /// GID table length; `grh.sgid_index` must be below (else EINVAL).
    pub gid_tbl_len: u32,
    /// Populated GID slots, bit `i % 64` of word `i / 64` for index `i`
    /// (covers every `u8` index); an address vector naming an empty slot
    /// fails with ENODATA.
    pub populated_gids: [u64; 4],
    /// The port the QP is bound to (its `port_num`, set at RESET→INIT), if
    /// known: at INIT→RTR the primary address vector must use it (uverbs
    /// `modify_qp`). `None` skips that check.
    pub qp_port: Option<u8>,
    /// Whether the caller may set a controlled Q_Key (bit 31; the kernel's
    /// `IB_QP_SET_QKEY`). Unprivileged processes get EPERM (Linux ≥ 6.5).
    pub privileged_qkey: bool,
}

impl ModifyLimits {
    /// Limits from the device and port attributes: no GID populated, no
    /// bound port, unprivileged Q_Key.
    pub fn new(dev: &DeviceAttr, port: &PortAttr) -> ModifyLimits {
        ModifyLimits {
            phys_port_cnt: dev.phys_port_cnt,
            link_layer: port.link_layer,
            pkey_tbl_len: port.pkey_tbl_len,
            max_mtu: port.max_mtu,
            max_qp_rd_atom: dev.max_qp_rd_atom,
            max_qp_init_rd_atom: dev.max_qp_init_rd_atom,
            gid_tbl_len: port.gid_tbl_len,
            populated_gids: [0; 4],
            qp_port: None,
            privileged_qkey: false,
        }
    }

    /// Marks GID slot `index` populated or empty.
    pub fn set_gid_populated(&mut self, index: u8, populated: bool) {
        let (word, bit) = (usize::from(index / 64), index % 64);
        if populated {
            self.populated_gids[word] |= 1u64 << bit;
        } else {
            self.populated_gids[word] &= !(1u64 << bit);
        }
    }

    /// Whether GID slot `index` is populated.
    pub fn gid_populated(&self, index: u8) -> bool {
        self.populated_gids[usize::from(index / 64)] & (1u64 << (index % 64)) != 0
    }
}

/// Bit 31 of a Q_Key: a controlled Q_Key (IBTA; kernel `IB_QP_SET_QKEY`).
const CONTROLLED_QKEY: u32 = 0x8000_0000;
/// PSNs and QPNs are 24 bits (BTH).
const MAX_24: u32 = 0xFF_FFFF;

fn einval(detail: String) -> Error {
    Error::new(Verb::ModifyQp, ErrorKind::InvalidArgument, detail)
}

/// Returns `EINVAL` from the enclosing function with a formatted message.
macro_rules! bail {
    ($($fmt:tt)+) => { return Err(einval(format!($($fmt)+))) };
}

/// `PKEY_INDEX|PORT`-style names of a mask, unknown bits in hex.
fn names(mask: QpAttrMask) -> String {
    let mut parts: Vec<String> = mask.iter_names().map(|(n, _)| n.to_string()).collect();
    let unknown = mask.bits() & !QpAttrMask::all().bits();
    if unknown != 0 {
        parts.push(format!("{unknown:#x}"));
    }
    parts.join("|")
}

fn check_port(what: &str, port: u8, limits: &ModifyLimits) -> Result<()> {
    if port == 0 || port > limits.phys_port_cnt {
        bail!(
            "invalid value of {what}: {port} (valid ports are 1..={})",
            limits.phys_port_cnt
        );
    }
    Ok(())
}

/// The address-vector checks of `rdma_fill_sgid_attr` and `mlx5_set_path`.
fn check_av(what: &str, av: &AhAttr, limits: &ModifyLimits) -> Result<()> {
    if !av.is_global {
        if limits.link_layer == LinkLayer::Ethernet {
            bail!("{what}.is_global must be set on RoCE (the GRH carries the address)");
        }
        return Ok(());
    }
    let index = av.grh.sgid_index;
    if u32::from(index) >= limits.gid_tbl_len {
        let len = limits.gid_tbl_len;
        bail!("invalid value of {what}.grh.sgid_index: {index} (GID table has {len} entries)");
    }
    if !limits.gid_populated(index) {
        let why = format!("{what}.grh.sgid_index {index} names an empty GID table slot");
        return Err(Error::new(Verb::ModifyQp, ErrorKind::Other(libc::ENODATA), why));
    }
    Ok(())
}

/// Checks a `modify_qp` of a `qp_type` QP now in state `current` and
/// returns the state it moves to (`attr.qp_state` with STATE in `mask`,
/// else `current`: an attribute-only modify).
///
/// # Errors
///
/// Always with [`Verb::ModifyQp`]:
/// - `EOPNOTSUPP` ([`ErrorKind::NotSupported`]): mask bits the verbs ABI
///   does not define.
/// - `EPERM` ([`ErrorKind::PermissionDenied`]): a controlled Q_Key (bit 31)
///   without `limits.privileged_qkey`.
/// - `ENODATA` ([`ErrorKind::Other`]): an address vector whose source GID
///   slot is empty.
/// - `EINVAL` ([`ErrorKind::InvalidArgument`]) otherwise, saying which:
///   illegal transition; missing required attribute(s); attribute(s) not
///   allowed in this transition; `cur_qp_state` not the QP's state; or an
///   invalid value (port, P_Key index, path MTU, read/atomic depth, timer
///   and retry fields, destination QPN, address vector, alternate path on
///   RoCE).
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &ModifyLimits,
) -> Result<QpState> {
    type M = QpAttrMask;
    let unknown = mask.bits() & !M::all().bits();
    if unknown != 0 {
        let why = format!("attribute mask bit(s) {unknown:#x} are not defined");
        return Err(Error::new(Verb::ModifyQp, ErrorKind::NotSupported, why));
    }
    let has_state = mask.contains(M::STATE);
    let to = if has_state { attr.qp_state } else { current };

    // Port numbers, as uverbs modify_qp() checks them before anything else.
    if mask.contains(M::PORT) {
        check_port("port_num", attr.port_num, limits)?;
    }
    if mask.contains(M::AV) {
        let av_port = attr.ah_attr.port_num;
        check_port("ah_attr.port_num", av_port, limits)?;
        if has_state && to == QpState::Rtr {
            if let Some(bound) = limits.qp_port.filter(|&p| p != av_port) {
                bail!("invalid value of ah_attr.port_num: {av_port} (the QP is bound to port {bound})");
            }
        } else if mask.contains(M::PORT) && attr.port_num != av_port {
            bail!(
                "invalid value of ah_attr.port_num: {av_port} (port_num is {})",
                attr.port_num
            );
        }
    }
    if mask.contains(M::ALT_PATH) {
        let (port, av_port) = (attr.alt_port_num, attr.alt_ah_attr.port_num);
        check_port("alt_port_num", port, limits)?;
        check_port("alt_ah_attr.port_num", av_port, limits)?;
        if port != av_port {
            bail!("invalid value of alt_ah_attr.port_num: {av_port} (alt_port_num is {port})");
        }
    }
    if mask.contains(M::QKEY) && attr.qkey & CONTROLLED_QKEY != 0 && !limits.privileged_qkey {
        let why = format!("qkey {:#x} is a controlled Q_Key (bit 31): needs privilege", attr.qkey);
        return Err(Error::new(Verb::ModifyQp, ErrorKind::PermissionDenied, why));
    }
    // Address vectors (rdma_fill_sgid_attr, mlx5_set_path); no APM on RoCE.
    if mask.contains(M::AV) {
        check_av("ah_attr", &attr.ah_attr, limits)?;
    }
    if mask.contains(M::ALT_PATH) {
        check_av("alt_ah_attr", &attr.alt_ah_attr, limits)?;
        if limits.link_layer == LinkLayer::Ethernet {
            bail!("alternate paths (ALT_PATH) are not supported on RoCE");
        }
    }

    // The state table (ib_modify_qp_is_ok).
    let Some(row) = transition(qp_type, current, to) else {
        bail!("illegal transition {current}->{to} for {qp_type} QPs");
    };
    let what = || match has_state {
        true => format!("{qp_type} {current}->{to}"),
        false => format!("an attribute-only modify of a {qp_type} QP in {current}"),
    };
    let missing = row.required - mask;
    if !missing.is_empty() {
        bail!("missing required attribute(s) {} for {}", names(missing), what());
    }
    let extra = mask - row.allowed();
    if !extra.is_empty() {
        bail!("attribute(s) {} not allowed in {}", names(extra), what());
    }
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != current {
        bail!(
            "invalid value of cur_qp_state: {} (the QP is in {current})",
            attr.cur_qp_state
        );
    }

    // Attribute values: (bit, field, value, largest valid value).
    if mask.contains(M::PATH_MTU) && attr.path_mtu.as_raw() > limits.max_mtu.as_raw() {
        bail!(
            "invalid value of path_mtu: {} (port max_mtu is {})",
            attr.path_mtu,
            limits.max_mtu
        );
    }
    let last_pkey = i64::from(limits.pkey_tbl_len) - 1;
    #[rustfmt::skip]
    let fields: [(M, &str, i64, i64); 10] = [
        (M::PKEY_INDEX, "pkey_index", attr.pkey_index.into(), last_pkey),
        (M::MAX_QP_RD_ATOMIC, "max_rd_atomic", attr.max_rd_atomic.into(), limits.max_qp_init_rd_atom.into()),
        (M::MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic", attr.max_dest_rd_atomic.into(), limits.max_qp_rd_atom.into()),
        (M::TIMEOUT, "timeout", attr.timeout.into(), 31),
        (M::RETRY_CNT, "retry_cnt", attr.retry_cnt.into(), 7),
        (M::RNR_RETRY, "rnr_retry", attr.rnr_retry.into(), 7),
        (M::MIN_RNR_TIMER, "min_rnr_timer", attr.min_rnr_timer.into(), 31),
        (M::DEST_QPN, "dest_qp_num", attr.dest_qp_num.into(), MAX_24.into()),
        (M::ALT_PATH, "alt_timeout", attr.alt_timeout.into(), 31),
        (M::ALT_PATH, "alt_pkey_index", attr.alt_pkey_index.into(), last_pkey),
    ];
    for (bit, name, value, max) in fields {
        if mask.contains(bit) && value > max {
            bail!("invalid value of {name}: {value} (at most {max})");
        }
    }
    Ok(to)
}

/// Applies a modify that [`check_modify`] accepted (returning `new_state`):
/// copies exactly the fields named by `mask` from `attr` into `stored` and
/// sets `qp_state` and `cur_qp_state` to `new_state`.
///
/// - Moving to RESET resets every attribute to its default except `cap`.
/// - PSNs are stored masked to 24 bits (`_ib_modify_qp`).
/// - ALT_PATH copies `alt_ah_attr`, `alt_port_num`, `alt_pkey_index` and
///   `alt_timeout` (uverbs); CUR_STATE names no stored field; CAP is never
///   accepted (queue sizes are fixed at creation) and is not copied.
/// - `sq_draining` is the provider's run-time flag: cleared outside SQD,
///   left alone otherwise.
pub fn apply_modify(stored: &mut QpAttr, attr: &QpAttr, mask: QpAttrMask, new_state: QpState) {
    if new_state == QpState::Reset {
        *stored = QpAttr {
            cap: stored.cap,
            ..QpAttr::default()
        };
        return;
    }
    macro_rules! copy {
        ($($bit:ident => $($field:ident),+;)+) => {
            $(if mask.contains(QpAttrMask::$bit) { $(stored.$field = attr.$field;)+ })+
        };
    }
    copy! {
        EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify;
        ACCESS_FLAGS => qp_access_flags;
        PKEY_INDEX => pkey_index;
        PORT => port_num;
        QKEY => qkey;
        AV => ah_attr;
        PATH_MTU => path_mtu;
        TIMEOUT => timeout;
        RETRY_CNT => retry_cnt;
        RNR_RETRY => rnr_retry;
        RQ_PSN => rq_psn;
        MAX_QP_RD_ATOMIC => max_rd_atomic;
        ALT_PATH => alt_ah_attr, alt_port_num, alt_pkey_index, alt_timeout;
        MIN_RNR_TIMER => min_rnr_timer;
        SQ_PSN => sq_psn;
        MAX_DEST_RD_ATOMIC => max_dest_rd_atomic;
        PATH_MIG_STATE => path_mig_state;
        DEST_QPN => dest_qp_num;
        RATE_LIMIT => rate_limit;
    }
    stored.rq_psn &= MAX_24;
    stored.sq_psn &= MAX_24;
    if new_state != QpState::Sqd {
        stored.sq_draining = false;
    }
    stored.qp_state = new_state;
    stored.cur_qp_state = new_state;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{AccessFlags, Gid, MigState, QpCap};
    use std::net::Ipv4Addr;
    use ErrorKind::{InvalidArgument as Inval, NotSupported, Other, PermissionDenied};
    use QpState::{Err as Error_, Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Rc, Uc, Ud};

    type M = QpAttrMask;

    /// One RoCE port, P_Key table of 1, GIDs 0 and 1 populated, QP on port 1.
    fn roce() -> ModifyLimits {
        ModifyLimits {
            phys_port_cnt: 1,
            link_layer: LinkLayer::Ethernet,
            pkey_tbl_len: 1,
            max_mtu: Mtu::Mtu4096,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            gid_tbl_len: 16,
            populated_gids: [0b11, 0, 0, 0],
            qp_port: Some(1),
            privileged_qkey: false,
        }
    }

    fn ib() -> ModifyLimits {
        ModifyLimits {
            link_layer: LinkLayer::InfiniBand,
            ..roce()
        }
    }

    /// Attributes valid for any transition, at the top of every range.
    #[rustfmt::skip]
    fn valid(from: QpState, to: QpState) -> QpAttr {
        let av = AhAttr::roce(Gid::from(Ipv4Addr::new(10, 0, 0, 2)), 1, 1);
        QpAttr {
            qp_state: to, cur_qp_state: from, path_mtu: Mtu::Mtu4096,
            path_mig_state: MigState::Rearm, qkey: 0x7fff_ffff, rq_psn: MAX_24, sq_psn: MAX_24,
            dest_qp_num: MAX_24, qp_access_flags: AccessFlags::REMOTE, ah_attr: av,
            alt_ah_attr: av, en_sqd_async_notify: true, max_rd_atomic: 16,
            max_dest_rd_atomic: 16, min_rnr_timer: 31, port_num: 1, timeout: 31, retry_cnt: 7,
            rnr_retry: 7, alt_port_num: 1, alt_timeout: 31, ..QpAttr::default()
        }
    }

    /// `check_modify` with [`valid`] attributes.
    fn check(t: QpType, from: QpState, to: QpState, mask: M, l: &ModifyLimits) -> Result<QpState> {
        check_modify(t, from, &valid(from, to), mask, l)
    }

    fn fails(r: Result<QpState>, kind: ErrorKind, fragment: &str) {
        let e = r.expect_err("modify should fail");
        assert_eq!((e.kind(), e.verb()), (kind, Verb::ModifyQp), "{e}");
        assert!(e.detail().contains(fragment), "{e:?} lacks {fragment:?}");
    }

    fn legal_rows() -> impl Iterator<Item = (QpType, QpState, QpState, TransitionMasks)> {
        QpType::ALL.iter().flat_map(|&t| {
            QpState::ALL.iter().flat_map(move |&f| {
                QpState::ALL
                    .iter()
                    .filter_map(move |&to| Some((t, f, to, transition(t, f, to)?)))
            })
        })
    }

    /// No row lists an attribute as both required and optional, and none
    /// lists STATE (it is implied): every mask is a union of distinct
    /// bits, so building it with `^` instead of `|` would change nothing
    /// (the equivalent mutants of docs/testing.md rest on this).
    #[test]
    fn no_row_lists_an_attribute_twice_or_names_state() {
        for (t, from, to, m) in legal_rows() {
            assert!((m.required & m.optional).is_empty(), "{t} {from}->{to}");
            assert!(!(m.required | m.optional).contains(M::STATE), "{t} {from}->{to}");
            assert_eq!(m.allowed(), m.required ^ m.optional ^ M::STATE, "{t} {from}->{to}");
        }
    }

    /// docs/design.md §3.2 / the kernel's qp_state_table, written out independently.
    #[test]
    fn the_table_is_exactly_design_3_2() {
        const C: &[QpType] = &[Uc, Rc];
        const ALL: &[QpType] = &[Ud, Uc, Rc];
        let rts_uc = "CUR_STATE|ACCESS_FLAGS|ALT_PATH|PATH_MIG_STATE";
        let rts_rc = "CUR_STATE|ACCESS_FLAGS|ALT_PATH|PATH_MIG_STATE|MIN_RNR_TIMER";
        #[rustfmt::skip]
        let rows: Vec<(QpState, QpState, &[QpType], &str, &str)> = vec![
            (Reset, Init, &[Ud], "PKEY_INDEX|PORT|QKEY", ""),
            (Reset, Init, C, "PKEY_INDEX|PORT|ACCESS_FLAGS", ""),
            (Init, Init, &[Ud], "", "PKEY_INDEX|PORT|QKEY"),
            (Init, Init, C, "", "PKEY_INDEX|PORT|ACCESS_FLAGS"),
            (Init, Rtr, &[Ud], "", "PKEY_INDEX|QKEY"),
            (Init, Rtr, &[Uc], "AV|PATH_MTU|DEST_QPN|RQ_PSN", "ALT_PATH|ACCESS_FLAGS|PKEY_INDEX"),
            (Init, Rtr, &[Rc], "AV|PATH_MTU|DEST_QPN|RQ_PSN|MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER",
                "ALT_PATH|ACCESS_FLAGS|PKEY_INDEX"),
            (Rtr, Rts, &[Ud], "SQ_PSN", "CUR_STATE|QKEY"),
            (Rtr, Rts, &[Uc], "SQ_PSN", rts_uc),
            (Rtr, Rts, &[Rc], "SQ_PSN|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC", rts_rc),
            (Rts, Rts, &[Ud], "", "CUR_STATE|QKEY"),
            (Rts, Rts, &[Uc], "", rts_uc),
            (Rts, Rts, &[Rc], "", rts_rc),
            (Rts, Sqd, ALL, "", "EN_SQD_ASYNC_NOTIFY"),
            (Sqd, Rts, &[Ud], "", "CUR_STATE|QKEY"),
            (Sqd, Rts, &[Uc], "", rts_uc),
            (Sqd, Rts, &[Rc], "", rts_rc),
            (Sqd, Sqd, &[Ud], "", "PKEY_INDEX|QKEY"),
            (Sqd, Sqd, &[Uc], "", "AV|ALT_PATH|ACCESS_FLAGS|PKEY_INDEX|PATH_MIG_STATE"),
            (Sqd, Sqd, &[Rc], "", "PORT|AV|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|\
                MAX_DEST_RD_ATOMIC|ALT_PATH|ACCESS_FLAGS|PKEY_INDEX|MIN_RNR_TIMER|PATH_MIG_STATE"),
            (Sqe, Rts, &[Ud], "", "CUR_STATE|QKEY"),
            (Sqe, Rts, &[Uc], "", "CUR_STATE|ACCESS_FLAGS"),
            (Reset, Reset, ALL, "", ""),
        ];
        let parse = |s: &str| {
            let names = s.split('|').filter(|n| !n.is_empty());
            names.fold(M::empty(), |m, n| m | M::from_name(n).expect(n))
        };
        for &t in QpType::ALL {
            for &from in QpState::ALL {
                for &to in QpState::ALL {
                    let row = rows.iter().find(|r| r.0 == from && r.1 == to && r.2.contains(&t));
                    // Unlisted: any->RESET and any->ERR but RESET->ERR, with STATE only.
                    let bare = from != Reset && matches!(to, Reset | Error_);
                    let expected = match row {
                        Some(r) => Some((parse(r.3), parse(r.4))),
                        None => bare.then_some((M::empty(), M::empty())),
                    };
                    let got = transition(t, from, to).map(|m| (m.required, m.optional));
                    assert_eq!(got, expected, "{t} {from}->{to}");
                }
            }
        }
        assert_eq!(legal_rows().count(), 22 + 22 + 21); // UD, UC, RC (no SQE->RTS)
    }

    #[test]
    fn legal_transitions_succeed_with_exactly_the_required_mask() {
        for (t, from, to, m) in legal_rows() {
            assert_eq!(
                check(t, from, to, M::STATE | m.required, &roce()),
                Ok(to),
                "{t} {from}->{to}"
            );
        }
    }

    #[test]
    fn every_optional_attribute_is_accepted_and_alt_path_only_off_roce() {
        for (t, from, to, m) in legal_rows() {
            for bit in m.optional.iter() {
                let mask = M::STATE | m.required | bit;
                assert_eq!(check(t, from, to, mask, &ib()), Ok(to), "{t} {from}->{to} +{bit:?}");
                match bit == M::ALT_PATH {
                    true => fails(check(t, from, to, mask, &roce()), Inval, "not supported on RoCE"),
                    false => {
                        assert_eq!(check(t, from, to, mask, &roce()), Ok(to), "{bit:?} on RoCE")
                    }
                }
            }
        }
    }

    #[test]
    fn each_missing_required_attribute_is_rejected() {
        for (t, from, to, m) in legal_rows() {
            for bit in m.required.iter() {
                let r = check(t, from, to, (M::STATE | m.required) - bit, &roce());
                fails(r, Inval, &format!("missing required attribute(s) {}", names(bit)));
            }
        }
    }

    #[test]
    fn each_attribute_outside_the_row_is_rejected() {
        for (t, from, to, m) in legal_rows() {
            for bit in (M::all() - m.allowed()).iter() {
                let r = check(t, from, to, M::STATE | m.required | bit, &ib());
                fails(r, Inval, &format!("attribute(s) {} not allowed", names(bit)));
            }
        }
    }

    #[test]
    fn illegal_transitions_fail_with_any_mask() {
        for &t in QpType::ALL {
            for &from in QpState::ALL {
                for &to in QpState::ALL.iter().filter(|&&to| transition(t, from, to).is_none()) {
                    let masks = M::all().iter().chain([M::empty(), M::all()]);
                    for mask in masks.map(|m| m | M::STATE) {
                        fails(check(t, from, to, mask, &ib()), Inval, "illegal transition");
                    }
                }
            }
        }
    }

    #[test]
    fn rc_sqe_to_rts_is_illegal_but_ud_and_uc_may_leave_sqe() {
        assert_eq!(transition(Rc, Sqe, Rts), None);
        fails(
            check(Rc, Sqe, Rts, M::STATE, &roce()),
            Inval,
            "illegal transition SQE->RTS for RC",
        );
        for t in [Ud, Uc] {
            assert_eq!(check(t, Sqe, Rts, M::STATE | M::CUR_STATE, &roce()), Ok(Rts));
        }
    }

    #[test]
    fn a_modify_without_state_uses_the_same_state_row() {
        let l = roce();
        assert_eq!(check(Rc, Rts, Rts, M::MIN_RNR_TIMER | M::ACCESS_FLAGS, &l), Ok(Rts));
        assert_eq!(check(Ud, Rts, Rts, M::QKEY | M::CUR_STATE, &l), Ok(Rts));
        assert_eq!(check(Rc, Sqd, Sqd, M::TIMEOUT | M::AV | M::PORT, &l), Ok(Sqd));
        // attr.qp_state is ignored without STATE.
        assert_eq!(check(Rc, Rts, Error_, M::ACCESS_FLAGS, &l), Ok(Rts));
        fails(
            check(Rc, Rts, Rts, M::TIMEOUT, &l),
            Inval,
            "attribute-only modify of a RC QP in RTS",
        );
        fails(check(Rc, Reset, Reset, M::PKEY_INDEX, &l), Inval, "not allowed");
        assert_eq!(check(Rc, Reset, Reset, M::empty(), &l), Ok(Reset)); // the RESET->RESET row
        fails(
            check(Rc, Rtr, Rtr, M::empty(), &l),
            Inval,
            "illegal transition RTR->RTR",
        );
    }

    #[test]
    fn cur_state_must_match_the_qp_state() {
        let (l, mask) = (roce(), M::STATE | M::CUR_STATE);
        let mut a = valid(Rts, Rts);
        assert_eq!(check_modify(Rc, Rts, &a, mask, &l), Ok(Rts));
        a.cur_qp_state = Sqd;
        fails(
            check_modify(Rc, Rts, &a, mask, &l),
            Inval,
            "cur_qp_state: SQD (the QP is in RTS)",
        );
        // Allowed only where the table lists it: not from RESET or INIT.
        fails(check(Rc, Init, Init, mask, &l), Inval, "CUR_STATE not allowed");
        fails(check(Ud, Init, Rtr, mask, &l), Inval, "CUR_STATE not allowed");
    }

    /// (label, type, from, to, mask beside STATE, spoiler, expected kind, detail fragment)
    type Case = (
        &'static str,
        QpType,
        QpState,
        QpState,
        M,
        Spoil,
        ErrorKind,
        &'static str,
    );
    type Spoil = fn(&mut QpAttr, &mut ModifyLimits);

    #[test]
    fn out_of_range_values_are_rejected() {
        let rtr = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        let rc_rtr = rtr | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
        let alt = rc_rtr | M::ALT_PATH;
        let rts = M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        let (init, ud_init) = (
            M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            M::PKEY_INDEX | M::PORT | M::QKEY,
        );
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("port 0", Rc, Reset, Init, init, |a, _| a.port_num = 0, Inval, "port_num: 0"),
            ("port 2", Rc, Reset, Init, init, |a, _| a.port_num = 2, Inval, "port_num: 2"),
            ("pkey index", Rc, Reset, Init, init, |a, _| a.pkey_index = 1, Inval, "pkey_index: 1"),
            ("UD pkey index", Ud, Reset, Init, ud_init, |a, _| a.pkey_index = 9, Inval, "pkey_index: 9"),
            ("controlled qkey", Ud, Reset, Init, ud_init, |a, _| a.qkey = 1 << 31, PermissionDenied, "controlled"),
            ("path mtu", Rc, Init, Rtr, rc_rtr, |_, l| l.max_mtu = Mtu::Mtu2048, Inval, "path_mtu: 4096"),
            ("max_dest_rd_atomic", Rc, Init, Rtr, rc_rtr, |a, _| a.max_dest_rd_atomic = 17, Inval, "max_dest_rd_atomic: 17"),
            ("min_rnr_timer", Rc, Init, Rtr, rc_rtr, |a, _| a.min_rnr_timer = 32, Inval, "min_rnr_timer: 32"),
            ("dest_qp_num", Uc, Init, Rtr, rtr, |a, _| a.dest_qp_num = 1 << 24, Inval, "dest_qp_num: 16777216"),
            ("AV without GRH on RoCE", Rc, Init, Rtr, rc_rtr, |a, _| a.ah_attr.is_global = false, Inval, "is_global"),
            ("AV port 0", Rc, Init, Rtr, rc_rtr, |a, _| a.ah_attr.port_num = 0, Inval, "ah_attr.port_num: 0"),
            ("AV port not the QP's", Rc, Init, Rtr, rc_rtr, |_, l| { l.phys_port_cnt = 2; l.qp_port = Some(2) }, Inval, "bound to port 2"),
            ("sgid past the table", Rc, Init, Rtr, rc_rtr, |a, _| a.ah_attr.grh.sgid_index = 16, Inval, "sgid_index: 16"),
            ("sgid slot empty", Uc, Init, Rtr, rtr, |_, l| l.set_gid_populated(1, false), Other(libc::ENODATA), "empty GID"),
            ("ALT_PATH on RoCE", Rc, Init, Rtr, alt, |_, _| {}, Inval, "RoCE"),
            ("alt port", Rc, Init, Rtr, alt, |a, l| { *l = ib(); a.alt_port_num = 2 }, Inval, "alt_port_num: 2"),
            ("alt AV port differs", Rc, Init, Rtr, alt, |a, l| { *l = ib(); l.phys_port_cnt = 2; a.alt_port_num = 2 }, Inval, "alt_ah_attr.port_num: 1"),
            ("alt timeout", Uc, Init, Rtr, rtr | M::ALT_PATH, |a, l| { *l = ib(); a.alt_timeout = 32 }, Inval, "alt_timeout: 32"),
            ("alt pkey index", Rc, Init, Rtr, alt, |a, l| { *l = ib(); a.alt_pkey_index = 1 }, Inval, "alt_pkey_index: 1"),
            ("alt sgid", Rc, Init, Rtr, alt, |a, l| { *l = ib(); a.alt_ah_attr.grh.sgid_index = 200 }, Inval, "alt_ah_attr.grh.sgid_index"),
            ("max_rd_atomic", Rc, Rtr, Rts, rts, |a, _| a.max_rd_atomic = 17, Inval, "max_rd_atomic: 17"),
            ("timeout", Rc, Rtr, Rts, rts, |a, _| a.timeout = 32, Inval, "timeout: 32"),
            ("retry_cnt", Rc, Rtr, Rts, rts, |a, _| a.retry_cnt = 8, Inval, "retry_cnt: 8"),
            ("rnr_retry", Rc, Rtr, Rts, rts, |a, _| a.rnr_retry = 8, Inval, "rnr_retry: 8"),
            ("PORT and AV disagree", Rc, Sqd, Sqd, M::PORT | M::AV, |a, l| { l.phys_port_cnt = 2; a.port_num = 2 }, Inval, "(port_num is 2)"),
            ("undefined mask bit", Rc, Rts, Rts, M::from_bits_retain(1 << 30), |_, _| {}, NotSupported, "0x40000000"),
        ];
        for (label, t, from, to, mask, spoil, want, fragment) in cases {
            let (mut a, mut l) = (valid(from, to), roce());
            if M::all().contains(mask) && !mask.contains(M::ALT_PATH) {
                assert_eq!(
                    check_modify(t, from, &a, M::STATE | mask, &l),
                    Ok(to),
                    "{label}: baseline"
                );
            }
            spoil(&mut a, &mut l);
            let e = check_modify(t, from, &a, M::STATE | mask, &l).expect_err(label);
            assert_eq!((e.kind(), e.verb()), (want, Verb::ModifyQp), "{label}: {e}");
            assert!(e.detail().contains(fragment), "{label}: {e}");
        }
    }

    #[test]
    fn privileged_callers_may_set_a_controlled_qkey_and_access_flags_are_not_range_checked() {
        let mut l = roce();
        let mut a = valid(Reset, Init);
        (a.qkey, l.privileged_qkey) = (0x8001_0000, true);
        assert_eq!(
            check_modify(Ud, Reset, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY, &l),
            Ok(Init)
        );
        a.qp_access_flags = AccessFlags::all(); // mlx5 ignores all but the REMOTE_* bits
        let mask = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert_eq!(check_modify(Rc, Reset, &a, mask, &l), Ok(Init));
    }

    /// check-then-apply, as the soft provider does it.
    fn modify(stored: &mut QpAttr, attr: &QpAttr, mask: M, l: &ModifyLimits) -> Result<QpState> {
        let new = check_modify(Rc, stored.qp_state, attr, mask, l)?;
        apply_modify(stored, attr, mask, new);
        Ok(new)
    }

    #[test]
    fn a_failed_modify_leaves_the_stored_attributes_untouched() {
        let mut stored = QpAttr::default();
        (stored.qp_state, stored.cur_qp_state, stored.port_num, stored.qkey) = (Init, Init, 1, 7);
        let before = stored;
        let mut bad = valid(Init, Rtr);
        bad.timeout = 99;
        let everything = M::all() - M::CAP - M::RATE_LIMIT;
        for mask in [M::AV, everything, M::PKEY_INDEX | M::TIMEOUT, M::STATE | M::TIMEOUT] {
            assert!(modify(&mut stored, &bad, M::STATE | mask, &roce()).is_err());
            assert_eq!(stored, before);
        }
    }

    type Set = fn(&mut QpAttr, &QpAttr);

    #[test]
    fn apply_copies_exactly_the_masked_fields() {
        let mut old = QpAttr::default();
        (old.qp_state, old.cur_qp_state, old.sq_draining) = (Sqd, Sqd, true);
        let mut new = valid(Sqd, Sqd);
        (new.cap.max_send_wr, new.rate_limit) = (9, 100);
        #[rustfmt::skip]
        let fields: [(M, Set); 21] = [
            (M::EN_SQD_ASYNC_NOTIFY, |s, n| s.en_sqd_async_notify = n.en_sqd_async_notify),
            (M::ACCESS_FLAGS, |s, n| s.qp_access_flags = n.qp_access_flags),
            (M::PKEY_INDEX, |s, n| s.pkey_index = n.pkey_index),
            (M::PORT, |s, n| s.port_num = n.port_num),
            (M::QKEY, |s, n| s.qkey = n.qkey),
            (M::AV, |s, n| s.ah_attr = n.ah_attr),
            (M::PATH_MTU, |s, n| s.path_mtu = n.path_mtu),
            (M::TIMEOUT, |s, n| s.timeout = n.timeout),
            (M::RETRY_CNT, |s, n| s.retry_cnt = n.retry_cnt),
            (M::RNR_RETRY, |s, n| s.rnr_retry = n.rnr_retry),
            (M::RQ_PSN, |s, n| s.rq_psn = n.rq_psn),
            (M::MAX_QP_RD_ATOMIC, |s, n| s.max_rd_atomic = n.max_rd_atomic),
            (M::ALT_PATH, |s, n| {
                (s.alt_ah_attr, s.alt_port_num, s.alt_pkey_index, s.alt_timeout) =
                    (n.alt_ah_attr, n.alt_port_num, n.alt_pkey_index, n.alt_timeout)
            }),
            (M::MIN_RNR_TIMER, |s, n| s.min_rnr_timer = n.min_rnr_timer),
            (M::SQ_PSN, |s, n| s.sq_psn = n.sq_psn),
            (M::MAX_DEST_RD_ATOMIC, |s, n| s.max_dest_rd_atomic = n.max_dest_rd_atomic),
            (M::PATH_MIG_STATE, |s, n| s.path_mig_state = n.path_mig_state),
            (M::DEST_QPN, |s, n| s.dest_qp_num = n.dest_qp_num),
            (M::RATE_LIMIT, |s, n| s.rate_limit = n.rate_limit),
            (M::CUR_STATE, |_, _| {}),
            (M::CAP, |_, _| {}),
        ];
        for (bit, set) in fields {
            let (mut stored, mut expected) = (old, old);
            apply_modify(&mut stored, &new, bit, Sqd);
            set(&mut expected, &new);
            assert_eq!(stored, expected, "{bit:?}");
        }
        let mut stored = old;
        apply_modify(&mut stored, &new, M::STATE, Rts);
        assert_eq!(
            (stored.qp_state, stored.cur_qp_state, stored.sq_draining),
            (Rts, Rts, false)
        );
    }

    #[test]
    fn psns_are_stored_as_24_bits() {
        let (mut stored, mut a) = (QpAttr::default(), QpAttr::default());
        (a.rq_psn, a.sq_psn) = (0xdead_beef, 0x0100_0001);
        apply_modify(&mut stored, &a, M::RQ_PSN | M::SQ_PSN, Rts);
        assert_eq!((stored.rq_psn, stored.sq_psn), (0xad_beef, 1));
    }

    #[test]
    fn reset_restores_defaults_but_keeps_the_queue_capacities() {
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 32,
            max_send_sge: 2,
            ..QpCap::default()
        };
        let mut stored = QpAttr { cap, ..valid(Rts, Rts) };
        apply_modify(&mut stored, &valid(Rts, Reset), M::STATE, Reset);
        assert_eq!(
            stored,
            QpAttr {
                cap,
                ..QpAttr::default()
            }
        );
    }

    #[test]
    fn an_rc_qp_walks_the_whole_state_machine() {
        let mut s = QpAttr::default();
        #[rustfmt::skip]
        let steps = [
            (Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            (Rtr, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER),
            (Rts, M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC),
            (Sqd, M::EN_SQD_ASYNC_NOTIFY),
            (Sqd, M::TIMEOUT | M::PORT | M::AV),
            (Rts, M::CUR_STATE),
            (Error_, M::empty()),
            (Reset, M::empty()),
        ];
        for (to, mask) in steps {
            let attr = valid(s.qp_state, to);
            assert_eq!(modify(&mut s, &attr, M::STATE | mask, &roce()), Ok(to));
            assert_eq!((s.qp_state, s.cur_qp_state), (to, to));
            if to == Rts {
                let got = (s.port_num, s.dest_qp_num, s.max_rd_atomic, s.ah_attr);
                assert_eq!(got, (1, MAX_24, 16, attr.ah_attr));
            }
        }
        assert_eq!(s, QpAttr::default());
        fails(
            modify(&mut s, &valid(Reset, Error_), M::STATE, &roce()),
            Inval,
            "RESET->ERR",
        );
    }

    #[test]
    fn the_gid_bitmap_covers_every_u8_index() {
        let mut l = roce();
        l.populated_gids = [0; 4];
        for (n, i) in [0, 3, 63, 64, 200, 255].into_iter().enumerate() {
            assert!(!l.gid_populated(i));
            l.set_gid_populated(i, true);
            let ones: u32 = l.populated_gids.iter().map(|w| w.count_ones()).sum();
            assert!(l.gid_populated(i) && ones as usize == n + 1);
        }
        l.set_gid_populated(255, false);
        assert_eq!(l.populated_gids, [1 | 1 << 3 | 1 << 63, 1, 0, 1 << (200 - 192)]);
    }
}
