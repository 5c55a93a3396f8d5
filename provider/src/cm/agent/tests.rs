//! Unit tests of the agent's event holding.

use std::sync::Arc;

use super::super::{Cm, CmConfig, CmEventKind, EventChannel, PortSpace};
use crate::soft::{link::inproc::InprocFabric, SoftDeviceConfig};
use crate::subsystem::{AddressChange, NamespaceId, SoftFactory, Subsystem, SubsystemConfig};

/// While the agent thread handles a MAD it holds back the events that
/// handling raises. An event another thread raises in that window (a
/// hotplug report here) is not the agent's: it reaches its channel before
/// the reporting call returns, as at any other time, so an application
/// that destroys the id next cannot lose it; and it comes after what the
/// agent had already raised for the same id.
#[test]
fn events_raised_by_other_threads_are_not_held_by_the_agent() {
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let fabric = InprocFabric::new();
    let mut names = Vec::new();
    for (name, ip) in [("held_a", "10.79.0.1"), ("held_b", "10.79.0.2")] {
        let cfg = SoftDeviceConfig {
            link: Some(fabric.clone()),
            ..SoftDeviceConfig::new(name, ip.parse().unwrap())
        };
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
        names.push(name);
    }
    let cm = Cm::new(sub.clone(), CmConfig::default()).unwrap();
    let ch = EventChannel::new().unwrap();
    let a = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    a.bind_addr("10.79.0.1:7600".parse().unwrap()).unwrap();
    let b = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    b.bind_addr("10.79.0.2:7600".parse().unwrap()).unwrap();

    // The agent's window, as `Inner::handled` opens it, for a thread that
    // is not this one, with what the agent raised in it so far: an event
    // for each id. All under one hold of the state lock, so the real
    // agent thread cannot open or close its own window meanwhile; what it
    // had is put back after.
    let agent = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
    let mut st = cm.shared.inner.lock();
    let before = st.held.take();
    let mut held = Vec::new();
    for key in [a.id(), b.id()] {
        held.push((key, st.event(key, CmEventKind::Disconnected).unwrap()));
    }
    st.held = Some((agent, held));

    // This thread raises an event for `a` (as a hotplug report does).
    st.post_kind(a.id(), CmEventKind::AddrChange);
    let kinds =
        |ch: &EventChannel| std::iter::from_fn(|| ch.try_get_event().map(|e| (e.id, e.kind))).collect::<Vec<_>>();
    // It is on the channel at once, after what the agent raised for the
    // same id before it; `b`'s event is still the agent's to post.
    assert_eq!(
        kinds(&ch),
        [(a.id(), CmEventKind::Disconnected), (a.id(), CmEventKind::AddrChange)]
    );
    let (holder, left) = st.held.as_ref().unwrap();
    assert_eq!(*holder, agent);
    assert_eq!(
        left.iter().map(|(k, e)| (*k, e.kind)).collect::<Vec<_>>(),
        [(b.id(), CmEventKind::Disconnected)]
    );

    // The holding thread's own events are held.
    st.held = Some((std::thread::current().id(), Vec::new()));
    st.post_kind(b.id(), CmEventKind::AddrChange);
    assert!(ch.try_get_event().is_none());
    assert_eq!(st.held.as_ref().unwrap().1.len(), 1);
    st.held = before;
    drop(st);

    // Through the subsystem: a report's event is on the channel when the
    // report returns (here with no window open, or the real agent's).
    sub.address_change(names[1], "10.79.0.2".parse().unwrap(), AddressChange::Removed)
        .unwrap();
    assert_eq!(kinds(&ch), [(b.id(), CmEventKind::AddrChange)]);
}
