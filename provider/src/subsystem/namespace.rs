//! Namespaces as the subsystem sees them: identifiers, the exclusive and
//! shared modes, and the weak reference a listener holds.
//!
//! A namespace here stands for a network namespace (Linux netns): devices
//! belong to one (exclusive mode) or are visible in all (shared mode), and
//! clients register for one or for all. Namespaces are created and deleted
//! by [`Subsystem`](super::Subsystem) (directly or through an emulator
//! driver); their identifiers are never reused.
//!
//! Listeners (the connection manager's, later) hold a [`WeakNamespace`]: it
//! does not keep the namespace alive, and deleting the namespace delivers
//! exactly one [`NamespaceEvent::Deleted`] to every [`NamespaceWatch`]
//! without waiting for anyone to read it.

use crate::sys::lock;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// A namespace's identifier. [`NamespaceId::INIT`] is the initial namespace,
/// which always exists; the others are numbered in creation order and never
/// reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceId(u32);

impl NamespaceId {
    /// The initial namespace (Linux `init_net`).
    pub const INIT: NamespaceId = NamespaceId(0);

    /// The identifier as a number.
    pub fn as_u32(self) -> u32 {
        self.0
    }

    pub(crate) fn from_u32(v: u32) -> NamespaceId {
        NamespaceId(v)
    }

    /// Whether this is the initial namespace.
    pub fn is_init(self) -> bool {
        self == NamespaceId::INIT
    }
}

impl fmt::Display for NamespaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_init() {
            f.write_str("ns:init")
        } else {
            write!(f, "ns:{}", self.0)
        }
    }
}

/// How devices map to namespaces (Linux `rdma system set netns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetnsMode {
    /// A device belongs to exactly one namespace and is visible only there;
    /// devices move between namespaces. The default.
    #[default]
    Exclusive,
    /// Every device belongs to the initial namespace and is visible in all;
    /// devices cannot move.
    Shared,
}

impl fmt::Display for NetnsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetnsMode::Exclusive => "exclusive",
            NetnsMode::Shared => "shared",
        })
    }
}

/// What a watch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceEvent {
    /// The namespace was deleted.
    Deleted(NamespaceId),
}

/// The life of one namespace: the subsystem's namespace table holds the only
/// strong reference, so deleting the namespace kills every weak one.
#[derive(Debug)]
pub(crate) struct NsLife {
    id: NamespaceId,
    /// The watches, and whether the namespace was deleted (under one lock,
    /// so a watch made during deletion cannot miss its event).
    watchers: Mutex<(Vec<Weak<WatchSlot>>, bool)>,
}

impl NsLife {
    pub(crate) fn new(id: NamespaceId) -> Arc<NsLife> {
        Arc::new(NsLife {
            id,
            watchers: Mutex::new((Vec::new(), false)),
        })
    }

    /// Ends the namespace's life: drops the last strong reference (so every
    /// [`WeakNamespace`] is dead), then delivers the one deletion event to
    /// every live watch. Never blocks on a watcher: it sets a flag and wakes
    /// whoever waits.
    pub(crate) fn retire(this: Arc<NsLife>) {
        let watchers = {
            let mut w = lock(&this.watchers);
            w.1 = true;
            std::mem::take(&mut w.0)
        };
        drop(this);
        for w in watchers.iter().filter_map(Weak::upgrade) {
            w.fire();
        }
    }
}

#[derive(Debug, Default)]
struct WatchSlot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct SlotState {
    fired: bool,
    taken: bool,
}

impl WatchSlot {
    fn fire(&self) {
        lock(&self.state).fired = true;
        self.cv.notify_all();
    }
}

/// A reference to a namespace that does not keep it alive.
///
/// # Examples
///
/// ```
/// use softverbs::subsystem::{NamespaceEvent, Subsystem, SubsystemConfig};
/// let sub = Subsystem::new(SubsystemConfig::default());
/// let ns = sub.create_namespace("blue")?;
/// let weak = sub.namespace_ref(ns)?;
/// let watch = weak.watch();
/// sub.delete_namespace(ns)?; // does not wait for the listener
/// assert!(!weak.is_alive());
/// assert_eq!(watch.take_event(), Some(NamespaceEvent::Deleted(ns)));
/// assert_eq!(watch.take_event(), None); // exactly one
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct WeakNamespace {
    id: NamespaceId,
    life: Weak<NsLife>,
}

impl WeakNamespace {
    pub(crate) fn new(life: &Arc<NsLife>) -> WeakNamespace {
        WeakNamespace {
            id: life.id,
            life: Arc::downgrade(life),
        }
    }

    /// A reference to the initial namespace, which is never deleted.
    pub(crate) fn init(life: &Arc<NsLife>) -> WeakNamespace {
        Self::new(life)
    }

    /// The namespace's identifier (still meaningful after deletion, never
    /// reused).
    pub fn id(&self) -> NamespaceId {
        self.id
    }

    /// Whether the namespace still exists.
    pub fn is_alive(&self) -> bool {
        self.life.strong_count() > 0
    }

    /// A watch that receives [`NamespaceEvent::Deleted`] exactly once when the
    /// namespace is deleted (immediately if it already was).
    pub fn watch(&self) -> NamespaceWatch {
        let slot = Arc::new(WatchSlot::default());
        match self.life.upgrade() {
            Some(life) => {
                let mut ws = lock(&life.watchers);
                if ws.1 {
                    slot.fire();
                } else {
                    ws.0.retain(|w| w.strong_count() > 0);
                    ws.0.push(Arc::downgrade(&slot));
                }
            }
            None => slot.fire(),
        }
        NamespaceWatch { id: self.id, slot }
    }
}

/// Receives the deletion of one namespace, once. Dropping it unsubscribes.
#[derive(Debug)]
pub struct NamespaceWatch {
    id: NamespaceId,
    slot: Arc<WatchSlot>,
}

impl NamespaceWatch {
    /// The namespace watched.
    pub fn namespace(&self) -> NamespaceId {
        self.id
    }

    /// Whether the namespace was deleted (whether or not the event was taken).
    pub fn is_deleted(&self) -> bool {
        lock(&self.slot.state).fired
    }

    /// The deletion event, the first time it is asked for after the
    /// deletion; `None` before and after that.
    pub fn take_event(&self) -> Option<NamespaceEvent> {
        let mut s = lock(&self.slot.state);
        if s.fired && !s.taken {
            s.taken = true;
            Some(NamespaceEvent::Deleted(self.id))
        } else {
            None
        }
    }

    /// Waits up to `timeout` (`None`: forever) for the deletion event and
    /// takes it. `None` if the time ran out or the event was already taken.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Option<NamespaceEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = lock(&self.slot.state);
        while !s.fired {
            match deadline {
                None => s = self.slot.cv.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    s = self.slot.cv.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
        if s.taken {
            return None;
        }
        s.taken = true;
        Some(NamespaceEvent::Deleted(self.id))
    }
}
