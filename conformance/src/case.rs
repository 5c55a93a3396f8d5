//! The case model: what a conformance case is, what it needs from a device,
//! the environment it runs in, and how it reports.
//!
//! A [`Case`] has a stable dotted id (`qp.state.rc.init_to_rtr.missing_av`),
//! a one-line description, the rule it checks (an IBTA clause, a man page or
//! a section of `docs/design.md`), the [`Cap`]abilities it needs, and a run function
//! written once against the backend-neutral API. The run function receives
//! an [`Env`] (two open contexts, which may be the same device) and returns
//! a [`Check`]: `Ok(())` is a pass, [`Stop::Fail`] a failure with a detail,
//! [`Stop::Skip`] "not applicable here" with a reason.
//!
//! A verbs call that returns `EOPNOTSUPP` turns into a skip through `?`
//! (`From<verbs::Error> for Stop`): a device without a feature is not a
//! failing device.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use softverbs::verbs::{
    AccessFlags, AtomicCap, BackendKind, Context, DestroyError, Device, DeviceAttr, DeviceCapFlags, Error, ErrorKind,
    PortAttr, PostError, QpCap, QpInitAttr, QpType,
};

/// A device capability a case may need. A case whose capabilities the device
/// lacks is reported as skipped (not applicable), never as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cap {
    /// 64-bit atomics (`atomic_cap` is not `ATOMIC_NONE`).
    Atomics,
    /// Shared receive queues (`max_srq > 0`).
    Srq,
    /// Resizing an SRQ (`IBV_DEVICE_SRQ_RESIZE`).
    SrqResize,
    /// Type 1 memory windows (`IBV_DEVICE_MEM_WINDOW`).
    MwType1,
    /// Type 2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B`).
    MwType2,
    /// Fast registration (`IBV_DEVICE_MEM_MGT_EXTENSIONS` and a page list).
    FastReg,
    /// Unreliable datagram QPs (probed by creating one).
    Ud,
    /// Unreliable connected QPs (probed by creating one).
    Uc,
    /// Inline data on send WRs (probed with a 64-byte inline capacity).
    Inline,
}

impl Cap {
    /// Every capability.
    pub const ALL: &'static [Cap] = &[
        Cap::Atomics,
        Cap::Srq,
        Cap::SrqResize,
        Cap::MwType1,
        Cap::MwType2,
        Cap::FastReg,
        Cap::Ud,
        Cap::Uc,
        Cap::Inline,
    ];

    /// Short lower-case name (`atomics`, `srq`, `mw1`, …) used in listings.
    pub fn name(self) -> &'static str {
        match self {
            Cap::Atomics => "atomics",
            Cap::Srq => "srq",
            Cap::SrqResize => "srq_resize",
            Cap::MwType1 => "mw1",
            Cap::MwType2 => "mw2",
            Cap::FastReg => "fast_reg",
            Cap::Ud => "ud",
            Cap::Uc => "uc",
            Cap::Inline => "inline",
        }
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a device offers: its attributes, port 1's attributes and the
/// [`Cap`]s derived from them (and from a few probes where `query_device`
/// says nothing, such as UC/UD support).
#[derive(Debug, Clone)]
pub struct Caps {
    /// `ibv_query_device`.
    pub device: DeviceAttr,
    /// `ibv_query_port(1)`.
    pub port: PortAttr,
    have: Vec<(Cap, Result<(), String>)>,
}

impl Caps {
    /// Queries and probes `ctx`.
    ///
    /// # Errors
    ///
    /// The error of `query_device` or `query_port` (the probes never fail:
    /// a failed probe means the capability is absent).
    pub fn probe(ctx: &Context) -> softverbs::verbs::Result<Caps> {
        let device = ctx.query_device()?;
        let port = ctx.query_port(1)?;
        let flags = device.device_cap_flags;
        let mut have = Vec::new();
        let from_flag = |ok: bool, why: &str| if ok { Ok(()) } else { Err(why.to_string()) };
        have.push((
            Cap::Atomics,
            from_flag(
                !matches!(device.atomic_cap, None | Some(AtomicCap::None)),
                "the device reports atomic_cap ATOMIC_NONE",
            ),
        ));
        have.push((Cap::Srq, from_flag(device.max_srq > 0, "the device reports max_srq 0")));
        have.push((
            Cap::SrqResize,
            from_flag(
                device.max_srq > 0 && flags.contains(DeviceCapFlags::SRQ_RESIZE),
                "the device lacks IBV_DEVICE_SRQ_RESIZE",
            ),
        ));
        have.push((
            Cap::MwType1,
            from_flag(
                device.max_mw > 0 && flags.contains(DeviceCapFlags::MEM_WINDOW),
                "the device lacks IBV_DEVICE_MEM_WINDOW",
            ),
        ));
        have.push((
            Cap::MwType2,
            from_flag(
                device.max_mw > 0
                    && flags.intersects(DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B),
                "the device lacks IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B",
            ),
        ));
        have.push((
            Cap::FastReg,
            from_flag(
                flags.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS) && device.max_fast_reg_page_list_len > 0,
                "the device lacks IBV_DEVICE_MEM_MGT_EXTENSIONS or a fast-registration page list",
            ),
        ));
        have.push((Cap::Ud, probe_qp(ctx, QpType::Ud, 0)));
        have.push((Cap::Uc, probe_qp(ctx, QpType::Uc, 0)));
        have.push((Cap::Inline, probe_qp(ctx, QpType::Rc, 64)));
        Ok(Caps { device, port, have })
    }

    /// Whether the device has `cap`.
    pub fn has(&self, cap: Cap) -> bool {
        self.why_not(cap).is_none()
    }

    /// Why the device lacks `cap` (`None` if it has it).
    pub fn why_not(&self, cap: Cap) -> Option<&str> {
        match self.have.iter().find(|(c, _)| *c == cap) {
            Some((_, Ok(()))) => None,
            Some((_, Err(why))) => Some(why),
            None => Some("not probed"),
        }
    }

    /// The capabilities present, for reports.
    pub fn present(&self) -> Vec<Cap> {
        Cap::ALL.iter().copied().filter(|&c| self.has(c)).collect()
    }
}

/// Creates (and drops) a small QP of `qp_type` to see whether the device
/// supports it.
fn probe_qp(ctx: &Context, qp_type: QpType, inline: u32) -> Result<(), String> {
    let attempt = || -> softverbs::verbs::Result<()> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4, 0, None, 0)?;
        let _qp = pd.create_qp(&QpInitAttr {
            qp_type,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            sq_sig_all: false,
        })?;
        Ok(())
    };
    attempt().map_err(|e| match inline {
        0 => format!("creating a {qp_type} QP fails: {e}"),
        _ => format!("creating a QP with {inline} bytes of inline data fails: {e}"),
    })
}

/// What a case runs with: two open contexts (on hardware both may be the
/// same device), the capabilities of the first, and where they come from.
/// The runner opens fresh contexts for every case, so async events left
/// over by one case never reach another.
pub struct Env {
    /// The first context ("side A", usually the requester).
    pub a: Context,
    /// The second context ("side B", usually the responder). The same
    /// device as `a` when only one device is available.
    pub b: Context,
    /// What the devices offer (probed once per run on side A's device).
    pub caps: Arc<Caps>,
    /// The backend under test.
    pub backend: BackendKind,
    /// Device name of side A.
    pub device_a: String,
    /// Device name of side B.
    pub device_b: String,
    /// Side A's device (for what goes below the verbs API, such as
    /// [`crate::harness::inject_packet`]).
    pub dev_a: Device,
    /// Side B's device.
    pub dev_b: Device,
}

impl Env {
    /// Whether both sides are the same device.
    pub fn same_device(&self) -> bool {
        self.device_a == self.device_b
    }

    /// Skips unless the device has `cap` (for a case that needs a
    /// capability in only one of its steps).
    ///
    /// # Errors
    ///
    /// [`Stop::Skip`] with the reason the capability is absent.
    pub fn require(&self, cap: Cap) -> Check {
        match self.caps.why_not(cap) {
            None => Ok(()),
            Some(why) => Err(Stop::Skip(format!("needs {cap}: {why}"))),
        }
    }

    /// The full access the suite gives MRs that peers read, write and
    /// update atomically.
    pub fn full_access() -> AccessFlags {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    }
}

/// Why a case stopped before the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The device departs from the rule: what was expected and what happened.
    Fail(String),
    /// The case does not apply to this device or backend, and why.
    Skip(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Fail(s) => write!(f, "fail: {s}"),
            Stop::Skip(s) => write!(f, "skip: {s}"),
        }
    }
}

/// The result of a case's run function: `Ok(())` passes.
pub type Check = Result<(), Stop>;

/// The skip reason for a verb the backend does not implement.
pub fn not_supported(e: &Error) -> Stop {
    Stop::Skip(format!("not supported by this backend: {e}"))
}

impl From<Error> for Stop {
    /// `EOPNOTSUPP` is "not applicable"; anything else fails the case.
    fn from(e: Error) -> Stop {
        match e.kind() {
            ErrorKind::NotSupported => not_supported(&e),
            _ => Stop::Fail(format!("unexpected error: {e}")),
        }
    }
}

impl From<PostError> for Stop {
    fn from(e: PostError) -> Stop {
        match e.error.kind() {
            ErrorKind::NotSupported => not_supported(&e.error),
            _ => Stop::Fail(format!("unexpected post failure: {e}")),
        }
    }
}

impl<T> From<DestroyError<T>> for Stop {
    fn from(e: DestroyError<T>) -> Stop {
        Stop::from(e.error)
    }
}

/// Fails the enclosing case (`return Err(Stop::Fail(..))`) with a formatted
/// detail.
#[macro_export]
macro_rules! fail {
    ($($fmt:tt)+) => { return Err($crate::case::Stop::Fail(format!($($fmt)+))) };
}

/// Skips the enclosing case with a formatted reason.
#[macro_export]
macro_rules! skip {
    ($($fmt:tt)+) => { return Err($crate::case::Stop::Skip(format!($($fmt)+))) };
}

/// Fails the enclosing case unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $crate::fail!($($fmt)+);
        }
    };
}

/// Fails the enclosing case unless `left == right`, naming `what`.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($fmt:tt)+) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            $crate::fail!("{}: expected {:?}, got {:?}", format!($($fmt)+), r, l);
        }
    }};
}

/// The run function of a case.
pub type RunFn = dyn Fn(&Env) -> Check + Send + Sync;

/// One conformance case.
pub struct Case {
    /// Stable dotted id: `area.object.detail` (lower case, `[a-z0-9_.]`).
    pub id: Cow<'static, str>,
    /// One line saying what the case does and expects.
    pub description: Cow<'static, str>,
    /// The rule it checks: an IBTA clause, a man page or a section of `docs/design.md`.
    pub rule: Cow<'static, str>,
    /// Capabilities without which the case is not applicable.
    pub requires: Vec<Cap>,
    /// The body.
    pub run: Box<RunFn>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("rule", &self.rule)
            .field("requires", &self.requires)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// A case.
    pub fn new(
        id: impl Into<Cow<'static, str>>,
        description: impl Into<Cow<'static, str>>,
        rule: impl Into<Cow<'static, str>>,
        requires: &[Cap],
        run: impl Fn(&Env) -> Check + Send + Sync + 'static,
    ) -> Case {
        Case {
            id: id.into(),
            description: description.into(),
            rule: rule.into(),
            requires: requires.to_vec(),
            run: Box::new(run),
        }
    }

    /// The area of the case: the first component of its id (`qp`, `err`, …).
    pub fn area(&self) -> &str {
        self.id.split('.').next().unwrap_or("")
    }

    /// The first required capability the device lacks, with the reason.
    pub fn not_applicable(&self, caps: &Caps) -> Option<String> {
        self.requires
            .iter()
            .find_map(|&c| caps.why_not(c).map(|why| format!("needs {c}: {why}")))
    }
}

/// Whether an id is well formed: non-empty dot-separated components of
/// `[a-z0-9_]`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}
