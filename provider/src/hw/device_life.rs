//! One hardware device's life: Live → Revoked → Inert, shared by every
//! context opened on the device and every object made from them (the words
//! of docs/design.md §5; the subsystem's record of the same device goes
//! Live → Revoked → Dead).
//!
//! A kernel device cannot be revoked from user space; what this backend can
//! do is stop using it and keep the promises of docs/design.md §5 itself:
//!
//! - **Revoked** ([`HwDeviceLife::revoke`], the subsystem's step 2): control
//!   verbs fail with `ENODEV`; every QP is moved to ERR (on a live device
//!   the hardware then flushes its work requests itself); posts no longer
//!   reach the device but go to the QP's shadow rings, to be flushed; CQ
//!   polls drop real completions already flushed and, once the real ones
//!   are drained, return what the rings hold as `WR_FLUSH_ERR` — at once on
//!   a device that is gone, after a short grace ([`LIVE_FLUSH_GRACE`]) on one that
//!   is still there, so that the hardware's own flushes come first; armed
//!   CQ notifications fire.
//! - DEVICE_FATAL ([`HwDeviceLife::raise_fatal`], step 5): every context
//!   gets it as its last async event. A DEVICE_FATAL the kernel reports for
//!   a device under the subsystem is held back until then, so that it stays
//!   the last event.
//! - **Inert** ([`HwDeviceLife::make_inert`], step 7): polls no longer call
//!   the provider (the rings still flush), posts fail with `ENODEV`.
//!
//! Destroy calls always go to libibverbs (that is what frees the user-space
//! half of an object); after a removal the `EIO` a disassociated device
//! returns for them counts as success (set `RDMAV_ALLOW_DISASSOC_DESTROY=1`
//! to have libibverbs free its memory in that case too).
//!
//! Lives are per device name, process wide: every device-list entry of one
//! kernel device shares one, so the subsystem's removal also reaches
//! contexts opened straight from `hw::provider()`. Unlisting a removed
//! device's life lets the next listing of that name start a new one.

use crate::sys::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::shadow::PollMode;
use crate::verbs::{Error, ErrorKind, Result, Verb};

/// How long, after a device that is still present was revoked, polls wait
/// for the hardware's own flush completions before flushing the rings.
pub(crate) const LIVE_FLUSH_GRACE: Duration = Duration::from_millis(20);

const LIVE: u8 = 0;
const REVOKED: u8 = 1;
const INERT: u8 = 2;

/// Where a device is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Usable.
    Live,
    /// Removed: control verbs fail, work flushes.
    Revoked,
    /// Removed and made inert: nothing reaches the device any more.
    Inert,
}

/// What a post does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostMode {
    /// Goes to the device.
    Device,
    /// Goes to the shadow only, to be flushed.
    Shadow,
    /// Fails with `ENODEV`.
    Refuse,
}

/// The kinds of objects a removal visits, in the order it visits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MemberKind {
    /// QPs: moved to ERR.
    Qp,
    /// CQs: armed notifications fire.
    Cq,
    /// Contexts: counted as holders, get DEVICE_FATAL.
    Context,
}

/// An object a removal acts on.
pub(crate) trait Member: Send + Sync {
    /// Step 2 of the removal (see the module documentation).
    fn revoke(&self, life: &HwDeviceLife);

    /// Step 5: DEVICE_FATAL (contexts only).
    fn device_fatal(&self) {}
}

/// One kernel device's life (see the module documentation).
pub(crate) struct HwDeviceLife {
    name: String,
    phase: AtomicU8,
    /// The device itself is gone (DEVICE_FATAL, `EIO`): nothing more will
    /// complete, flush at once.
    gone: AtomicBool,
    /// Under the subsystem: a kernel DEVICE_FATAL waits for step 5.
    managed: AtomicBool,
    fatal_released: AtomicBool,
    listed: AtomicBool,
    revoked_at: OnceLock<Instant>,
    seq: AtomicU64,
    members: Mutex<Members>,
}

#[derive(Default)]
struct Members {
    list: Vec<(MemberKind, Weak<dyn Member>)>,
    prune_at: usize,
}

impl std::fmt::Debug for HwDeviceLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwDeviceLife")
            .field("name", &self.name)
            .field("phase", &self.phase())
            .field("gone", &self.is_gone())
            .finish_non_exhaustive()
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<HwDeviceLife>>> {
    static R: OnceLock<Mutex<HashMap<String, Weak<HwDeviceLife>>>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

impl HwDeviceLife {
    /// The life of the device named `name`: the current one, or a new one if
    /// the last was removed (or nothing holds it).
    pub(crate) fn for_device(name: &str) -> Arc<HwDeviceLife> {
        let mut r = lock(registry());
        if let Some(l) = r.get(name).and_then(Weak::upgrade) {
            if l.listed.load(Ordering::Acquire) && l.phase() == Phase::Live {
                return l;
            }
        }
        let l = HwDeviceLife::unlisted(name);
        l.listed.store(true, Ordering::Release);
        r.retain(|_, w| w.strong_count() > 0);
        r.insert(name.to_string(), Arc::downgrade(&l));
        l
    }

    /// A life of its own, outside the registry (tests, private contexts).
    pub(crate) fn unlisted(name: &str) -> Arc<HwDeviceLife> {
        Arc::new(HwDeviceLife {
            name: name.to_string(),
            phase: AtomicU8::new(LIVE),
            gone: AtomicBool::new(false),
            managed: AtomicBool::new(false),
            fatal_released: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            revoked_at: OnceLock::new(),
            seq: AtomicU64::new(0),
            members: Mutex::new(Members {
                list: Vec::new(),
                prune_at: 64,
            }),
        })
    }

    /// Where the device is in its life.
    #[inline]
    pub(crate) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            LIVE => Phase::Live,
            REVOKED => Phase::Revoked,
            _ => Phase::Inert,
        }
    }

    /// Whether the device is usable.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.phase.load(Ordering::Acquire) == LIVE
    }

    /// The error of a control verb on a removed device.
    pub(crate) fn gone(&self, verb: Verb) -> Error {
        Error::new(verb, ErrorKind::NoDevice, format!("{} was removed", self.name))
    }

    /// `Ok` while the device is live; `ENODEV` after its removal started.
    #[inline]
    pub(crate) fn check(&self, verb: Verb) -> Result<()> {
        if self.is_live() {
            Ok(())
        } else {
            Err(self.gone(verb))
        }
    }

    /// What a post does now.
    #[inline]
    pub(crate) fn post_mode(&self) -> PostMode {
        match self.phase.load(Ordering::Acquire) {
            LIVE => PostMode::Device,
            REVOKED => PostMode::Shadow,
            _ => PostMode::Refuse,
        }
    }

    /// How a CQ polls now.
    #[inline]
    pub(crate) fn poll_mode(&self) -> PollMode {
        match self.phase.load(Ordering::Acquire) {
            LIVE => PollMode::LIVE,
            REVOKED => PollMode {
                reach_device: true,
                revoked: true,
                flush: self.is_gone() || self.revoked_at.get().is_none_or(|t| t.elapsed() >= LIVE_FLUSH_GRACE),
            },
            _ => PollMode {
                reach_device: false,
                revoked: true,
                flush: true,
            },
        }
    }

    /// The result of a destroy call: after a removal, the `EIO` of a
    /// disassociated device means the kernel object is already gone.
    pub(crate) fn destroy_rc(&self, rc: i32) -> i32 {
        if rc.abs() == libc::EIO && (!self.is_live() || self.is_gone()) {
            0
        } else {
            rc
        }
    }

    /// A number that orders the QPs of this device by creation.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds an object a removal must visit.
    pub(crate) fn register(&self, kind: MemberKind, member: Weak<dyn Member>) {
        let mut m = lock(&self.members);
        if m.list.len() >= m.prune_at {
            m.list.retain(|(_, w)| w.strong_count() > 0);
            m.prune_at = (m.list.len() * 2).max(64);
        }
        m.list.push((kind, member));
    }

    /// The live members, in the order a removal visits them.
    fn members(&self) -> Vec<(MemberKind, Arc<dyn Member>)> {
        let m = lock(&self.members);
        let mut v: Vec<(MemberKind, Arc<dyn Member>)> = m
            .list
            .iter()
            .filter_map(|(k, w)| w.upgrade().map(|a| (*k, a)))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// Contexts open on the device (every object holds its context).
    pub(crate) fn open_contexts(&self) -> usize {
        lock(&self.members)
            .list
            .iter()
            .filter(|(k, w)| *k == MemberKind::Context && w.strong_count() > 0)
            .count()
    }

    /// Step 2 of a removal (see the module documentation). Idempotent.
    pub(crate) fn revoke(&self) {
        if self
            .phase
            .compare_exchange(LIVE, REVOKED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let _ = self.revoked_at.set(Instant::now());
        for (_, m) in self.members() {
            m.revoke(self);
        }
    }

    /// Step 5: DEVICE_FATAL on every context (releasing one the kernel
    /// reported and that was held back). Idempotent per context.
    pub(crate) fn raise_fatal(&self) {
        self.fatal_released.store(true, Ordering::Release);
        for (k, m) in self.members() {
            if k == MemberKind::Context {
                m.device_fatal();
            }
        }
    }

    /// Step 7: nothing reaches the device any more.
    pub(crate) fn make_inert(&self) {
        let _ = self.revoked_at.set(Instant::now());
        self.phase.store(INERT, Ordering::Release);
    }

    /// The device itself is gone (DEVICE_FATAL, or `EIO` from it).
    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// Whether the device itself is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// The device is under the subsystem: a kernel DEVICE_FATAL is held
    /// back until [`HwDeviceLife::raise_fatal`].
    pub(crate) fn set_managed(&self, managed: bool) {
        self.managed.store(managed, Ordering::Release);
    }

    /// Whether a kernel DEVICE_FATAL must wait for step 5.
    pub(crate) fn holds_fatal(&self) -> bool {
        self.managed.load(Ordering::Acquire) && !self.fatal_released.load(Ordering::Acquire)
    }

    /// Takes the life out of the registry: the next listing of the name
    /// gets a new one. Idempotent.
    pub(crate) fn unlist(self: &Arc<Self>) {
        if self.listed.swap(false, Ordering::AcqRel) {
            let mut r = lock(registry());
            if r.get(&self.name)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(self)))
            {
                r.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Probe {
        log: Mutex<Vec<String>>,
    }

    struct Obj {
        name: &'static str,
        probe: Arc<Probe>,
    }

    impl Member for Obj {
        fn revoke(&self, life: &HwDeviceLife) {
            assert_eq!(life.phase(), Phase::Revoked);
            lock(&self.probe.log).push(format!("revoke {}", self.name));
        }

        fn device_fatal(&self) {
            lock(&self.probe.log).push(format!("fatal {}", self.name));
        }
    }

    fn member(name: &'static str, probe: &Arc<Probe>) -> Arc<dyn Member> {
        Arc::new(Obj {
            name,
            probe: probe.clone(),
        })
    }

    #[test]
    fn removal_visits_qps_then_cqs_and_contexts_get_fatal() {
        let life = HwDeviceLife::unlisted("life_t0");
        let probe = Arc::new(Probe::default());
        let ctx = member("ctx", &probe);
        let cq = member("cq", &probe);
        let qp = member("qp", &probe);
        let gone = member("gone", &probe);
        life.register(MemberKind::Context, Arc::downgrade(&ctx));
        life.register(MemberKind::Cq, Arc::downgrade(&cq));
        life.register(MemberKind::Qp, Arc::downgrade(&qp));
        life.register(MemberKind::Qp, Arc::downgrade(&gone));
        drop(gone);
        assert_eq!(life.open_contexts(), 1);
        assert!(life.check(Verb::AllocPd).is_ok());
        assert_eq!(life.post_mode(), PostMode::Device);
        assert_eq!(life.poll_mode(), PollMode::LIVE);

        life.revoke();
        life.revoke();
        assert_eq!(*lock(&probe.log), ["revoke qp", "revoke cq", "revoke ctx"]);
        let e = life.check(Verb::AllocPd).unwrap_err();
        assert_eq!((e.kind(), e.verb()), (ErrorKind::NoDevice, Verb::AllocPd));
        assert!(e.detail().contains("life_t0"));
        assert_eq!(life.post_mode(), PostMode::Shadow);
        let m = life.poll_mode();
        assert!(m.reach_device && m.revoked);
        // A device still present: the hardware's flushes get a grace.
        assert!(!m.flush, "within the grace period");
        std::thread::sleep(LIVE_FLUSH_GRACE);
        assert!(life.poll_mode().flush);

        assert!(!life.holds_fatal(), "not under the subsystem");
        life.raise_fatal();
        assert_eq!(lock(&probe.log).last().unwrap(), "fatal ctx");

        life.make_inert();
        assert_eq!(life.post_mode(), PostMode::Refuse);
        assert!(!life.poll_mode().reach_device);
        assert_eq!(life.destroy_rc(libc::EIO), 0);
        assert_eq!(life.destroy_rc(libc::EBUSY), libc::EBUSY);
    }

    #[test]
    fn a_gone_device_flushes_at_once_and_holds_fatal_when_managed() {
        let life = HwDeviceLife::unlisted("life_t1");
        assert_eq!(life.destroy_rc(-libc::EIO), -libc::EIO, "EIO of a live device stays");
        life.set_managed(true);
        assert!(life.holds_fatal());
        life.mark_gone();
        assert_eq!(life.destroy_rc(libc::EIO), 0);
        life.revoke();
        assert!(life.poll_mode().flush, "nothing more will complete");
        life.raise_fatal();
        assert!(!life.holds_fatal());
    }

    #[test]
    fn the_registry_shares_a_life_until_it_is_unlisted() {
        let a = HwDeviceLife::for_device("life_t2");
        let b = HwDeviceLife::for_device("life_t2");
        assert!(Arc::ptr_eq(&a, &b));
        a.revoke();
        let c = HwDeviceLife::for_device("life_t2");
        assert!(!Arc::ptr_eq(&a, &c), "a removed device's life is not reused");
        c.unlist();
        c.unlist();
        let d = HwDeviceLife::for_device("life_t2");
        assert!(!Arc::ptr_eq(&c, &d));
        a.unlist(); // not the registered one: leaves d alone
        assert!(Arc::ptr_eq(&d, &HwDeviceLife::for_device("life_t2")));
        assert_eq!(d.name, "life_t2");
        assert_eq!((d.next_seq(), d.next_seq()), (0, 1));
    }
}
