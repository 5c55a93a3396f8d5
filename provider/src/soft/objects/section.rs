//! Device sections ([`DeviceSection`]) of the soft provider: a closure
//! run inside a verb's own hold of the engine lock, through which the
//! objects of that device are posted to and polled. The ULP layer keeps
//! its per-request state under this lock, so a post or a poll through it
//! takes no lock of its own.

use std::sync::Arc;

use super::super::engine::DeviceShared;
use super::super::proto::{Core, CqId, Egress, Nanos};
use super::{soft_of, SoftCq, SoftQp};
use crate::verbs::backend::{CqOps, DeviceSection, QpOps};
use crate::verbs::{Error, PostError, RecvWr, Result, SendWr, WorkCompletion};

thread_local! {
    /// Whether this thread runs a [`DeviceSection`] (debug builds check
    /// that no verb is called from one: it would lock the engine again).
    static IN_SECTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as inside a section while it lives (debug builds;
/// nothing in release builds).
struct InSection(#[cfg(debug_assertions)] bool);

impl InSection {
    #[inline(always)]
    fn enter() -> InSection {
        InSection(
            #[cfg(debug_assertions)]
            IN_SECTION.replace(true),
        )
    }
}

#[cfg(debug_assertions)]
impl Drop for InSection {
    fn drop(&mut self) {
        IN_SECTION.set(self.0);
    }
}

/// Whether this thread runs a device section (for the engine's check
/// that no verb is called from one).
pub(crate) fn in_section() -> bool {
    IN_SECTION.get()
}

/// The engine, locked, as a [`DeviceSection`]: posts and polls go
/// straight to it.
struct SoftSection<'a, 'e> {
    dev: &'a Arc<DeviceShared>,
    core: &'a mut Core,
    /// The verb's clock reading; `None` in a receive's section
    /// ([`SoftLock::enter_qp`] for a receive), which reads the clock only if it
    /// posts a send after all.
    now: Option<Nanos>,
    /// The post's early way out to the link (`with_core_eager`), for the
    /// section's first send post.
    egress: Option<Egress<'e>>,
    /// The object the section was opened on: posts to it (or polls of
    /// it) need not find out which soft object of which device it is.
    opener: Opener,
}

/// The object a [`SoftSection`] was opened on: its address (compared,
/// never dereferenced) and its number in the engine.
#[derive(Clone, Copy)]
enum Opener {
    Qp(usize, u32),
    Cq(usize, CqId),
}

impl SoftSection<'_, '_> {
    /// The engine's number of `qp`, a QP of this section's device.
    #[inline]
    fn qpn_of(&self, qp: &dyn QpOps, verb: crate::verbs::Verb) -> Result<u32> {
        if let Opener::Qp(p, qpn) = self.opener {
            if std::ptr::from_ref(qp).cast::<()>() as usize == p {
                return Ok(qpn);
            }
        }
        let q = soft_of::<SoftQp>(qp, "QP", verb)?.same_device(self.dev, verb)?;
        Ok(q.qpn)
    }

    /// The engine's id of `cq`, a CQ of this section's device.
    #[inline]
    fn cq_of(&self, cq: &dyn CqOps) -> Result<CqId> {
        if let Opener::Cq(p, id) = self.opener {
            if std::ptr::from_ref(cq).cast::<()>() as usize == p {
                return Ok(id);
            }
        }
        let c = soft_of::<SoftCq>(cq, "CQ", crate::verbs::Verb::PollCq)?;
        if !Arc::ptr_eq(&c.ctx.dev, self.dev) {
            return Err(other_device(crate::verbs::Verb::PollCq));
        }
        Ok(c.id)
    }
}

impl DeviceSection for SoftSection<'_, '_> {
    fn post_send(&mut self, qp: &dyn QpOps, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let qpn = self
            .qpn_of(qp, crate::verbs::Verb::PostSend)
            .map_err(|error| PostError { index: 0, error })?;
        crate::soft::probe::mark(crate::soft::probe::Point::PostSend);
        let now = *self.now.get_or_insert_with(|| self.dev.now());
        let r = self.core.post_send_eager(now, qpn, wrs, self.egress.take());
        let posted = match &r {
            Ok(()) => wrs.len(),
            Err(e) => e.index,
        };
        SoftQp::follow_keys(&wrs[..posted]);
        r
    }

    fn post_recv(&mut self, qp: &dyn QpOps, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let qpn = self
            .qpn_of(qp, crate::verbs::Verb::PostRecv)
            .map_err(|error| PostError { index: 0, error })?;
        crate::soft::probe::mark(crate::soft::probe::Point::PostRecv);
        self.core.post_recv(qpn, wrs)
    }

    fn poll(&mut self, cq: &dyn CqOps, wc: &mut [WorkCompletion]) -> Result<usize> {
        let id = self.cq_of(cq)?;
        let r = self.core.poll_cq(id, wc);
        if matches!(r, Ok(n) if n > 0) {
            crate::soft::probe::mark(crate::soft::probe::Point::PollHit);
        }
        r
    }
}

#[cold]
fn other_device(verb: crate::verbs::Verb) -> Error {
    Error::new(
        verb,
        crate::verbs::ErrorKind::InvalidArgument,
        "the object belongs to another device than the section's",
    )
}

/// The engine lock of a soft QP or CQ, entered without a dynamic call:
/// a section opened through it runs its closure in line in the verb's
/// own frame, and its posts and polls of the object it was opened on go
/// straight to the engine.
pub(crate) struct SoftLock {
    dev: Arc<DeviceShared>,
    opener: Opener,
}

impl SoftLock {
    fn for_qp(qp: &SoftQp) -> SoftLock {
        SoftLock {
            dev: qp.pd.ctx.dev.clone(),
            opener: Opener::Qp(std::ptr::from_ref(qp) as usize, qp.qpn),
        }
    }

    fn for_cq(cq: &SoftCq) -> SoftLock {
        SoftLock {
            dev: cq.ctx.dev.clone(),
            opener: Opener::Cq(std::ptr::from_ref(cq) as usize, cq.id),
        }
    }

    /// The lock of `qp`, if it is a soft QP.
    pub(crate) fn of_qp(qp: &dyn QpOps) -> Option<SoftLock> {
        qp.as_any().downcast_ref::<SoftQp>().map(SoftLock::for_qp)
    }

    /// The lock of `cq`, if it is a soft CQ.
    pub(crate) fn of_cq(cq: &dyn CqOps) -> Option<SoftLock> {
        cq.as_any().downcast_ref::<SoftCq>().map(SoftLock::for_cq)
    }

    /// Whether `a` and `b` guard alike: both the lock of one engine, or
    /// neither a soft lock.
    pub(crate) fn alike(a: Option<&SoftLock>, b: Option<&SoftLock>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a.dev, &b.dev),
            (None, None) => true,
            _ => false,
        }
    }

    /// Runs `f` in a section opened on the QP, inside a send post's hold
    /// of the engine lock (`with_core_eager`: the section's first send
    /// post may leave by the link's fast way out), or, if `recv`, inside a
    /// receive post's: the lock and nothing else (no clock read, no link
    /// I/O, no timers), as `ibv_post_recv` takes it; the events `f` raises
    /// are dispatched after, and should it post a send after all, the full
    /// path sends it.
    #[inline(always)]
    pub(crate) fn enter_qp<R>(&self, recv: bool, f: impl FnOnce(&mut dyn DeviceSection) -> R) -> R {
        let (dev, opener) = (&self.dev, self.opener);
        if recv {
            dev.with_core_local(|core| run(f, dev, core, None, None, opener))
        } else {
            dev.with_core_eager(|core, now, egress| run(f, dev, core, Some(now), egress, opener))
        }
    }

    /// Runs `f` in a section opened on the CQ, inside a poll's hold of the
    /// engine lock if `poll` (the link is read first, as a poll does),
    /// else inside a plain verb's.
    #[inline(always)]
    pub(crate) fn enter_cq<R>(&self, poll: bool, f: impl FnOnce(&mut dyn DeviceSection) -> R) -> R {
        let (dev, opener) = (&self.dev, self.opener);
        if poll {
            dev.poll_with(|core, now| run(f, dev, core, Some(now), None, opener))
        } else {
            dev.with_core(|core, now| run(f, dev, core, Some(now), None, opener))
        }
    }
}

/// Runs `f` in the section of the locked engine `core`.
#[inline(always)]
fn run<R>(
    f: impl FnOnce(&mut dyn DeviceSection) -> R,
    dev: &Arc<DeviceShared>,
    core: &mut Core,
    now: Option<Nanos>,
    egress: Option<Egress<'_>>,
    opener: Opener,
) -> R {
    let _in = InSection::enter();
    f(&mut SoftSection {
        dev,
        core,
        now,
        egress,
        opener,
    })
}

impl SoftQp {
    /// `self`, if it belongs to `dev`.
    fn same_device(&self, dev: &Arc<DeviceShared>, verb: crate::verbs::Verb) -> Result<&SoftQp> {
        if Arc::ptr_eq(&self.pd.ctx.dev, dev) {
            Ok(self)
        } else {
            Err(other_device(verb))
        }
    }
}
