//! Unit tests of the agent's event holding.

use std::sync::Arc;

use super::super::{Cm, CmConfig, CmEventKind, EventChannel, PortSpace};
use crate::soft::{link::inproc::InprocFabric, SoftDeviceConfig};
use crate::subsystem::{AddressChange, NamespaceId, SoftFactory, Subsystem, SubsystemConfig};

/// While the agent thread handles a MAD it holds back the events that
/// handling raises. An event another thread raises in that window (a
/// hotplug report here) is not the agent's: it reaches its channel before
/// the reporting call returns, as at any other time, so an application
/// that destroys the id next cannot lose it.
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
    // is not this one.
    let agent = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
    let hold = || cm.shared.inner.lock().held = Some((agent, Vec::new()));

    hold();
    sub.address_change(names[0], "10.79.0.1".parse().unwrap(), AddressChange::Removed)
        .unwrap();
    let ev = ch
        .try_get_event()
        .expect("the ADDR_CHANGE is on the channel when the report returns");
    assert_eq!((ev.kind, ev.id), (CmEventKind::AddrChange, a.id()));

    hold();
    sub.remove_device(names[1]).unwrap();
    let ev = ch
        .try_get_event()
        .expect("the DEVICE_REMOVAL is on the channel when the removal returns");
    assert_eq!((ev.kind, ev.id), (CmEventKind::DeviceRemoval, b.id()));

    // What the agent itself raises in its window is still held, and only
    // for it: nothing of this test's went there.
    let st = cm.shared.inner.lock();
    if let Some((holder, held)) = &st.held {
        assert_eq!(*holder, agent);
        assert!(held.is_empty(), "{held:?}");
    }
}
