//! Namespaces in the device subsystem: exclusive and shared modes, the mode
//! switch, moves (unplug + replug), deletion returning devices to the
//! initial namespace, events carrying {namespace, device, generation}, and
//! the weak reference a listener holds.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::*;
use softverbs::verbs::{self, ErrorKind};

fn soft(name: &str, last: u8) -> Arc<SoftFactory> {
    SoftFactory::new(SoftDeviceConfig {
        link: Some(InprocFabric::new()),
        ..SoftDeviceConfig::new(name, format!("10.64.0.{last}").parse().unwrap())
    })
}

fn sub() -> Subsystem {
    Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    })
}

/// Logs "add|remove NS GEN (reason)".
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Client for Log {
    fn add(&self, d: &DeviceRef) -> verbs::Result<()> {
        self.0
            .lock()
            .unwrap()
            .push(format!("add {} {}", d.namespace(), d.generation()));
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        self.0
            .lock()
            .unwrap()
            .push(format!("remove {} {} ({why})", d.namespace(), d.generation()));
    }
}

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[test]
fn namespace_lifecycle_errors() {
    let s = sub();
    assert_eq!(s.mode(), NetnsMode::Exclusive);
    assert_eq!(s.namespaces(), [(NamespaceId::INIT, "init".to_string())]);
    let a = s.create_namespace("a").unwrap();
    assert!(!a.is_init());
    assert_eq!(s.create_namespace("a").unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(s.create_namespace("").unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(s.namespace_by_name("a"), Some(a));
    assert_eq!(
        s.delete_namespace(NamespaceId::INIT).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    s.delete_namespace(a).unwrap();
    assert_eq!(s.delete_namespace(a).unwrap_err().kind(), ErrorKind::NotFound);
    // Identifiers are never reused; a deleted one names nothing.
    let b = s.create_namespace("a").unwrap();
    assert_ne!(a, b);
    assert_eq!(
        s.register_client("x", ClientScope::Namespace(a), Arc::new(Log::default()))
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    assert_eq!(s.namespace_ref(a).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        s.add_device(soft("ns_err0", 1), a).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn mode_switch_is_ebusy_while_extra_namespaces_exist() {
    let s = sub();
    let a = s.create_namespace("a").unwrap();
    assert_eq!(s.set_mode(NetnsMode::Shared).unwrap_err().kind(), ErrorKind::Busy);
    s.set_mode(NetnsMode::Exclusive).unwrap(); // no change: fine
    s.delete_namespace(a).unwrap();
    s.set_mode(NetnsMode::Shared).unwrap();
    assert_eq!(s.mode(), NetnsMode::Shared);
    let b = s.create_namespace("b").unwrap();
    assert_eq!(s.set_mode(NetnsMode::Exclusive).unwrap_err().kind(), ErrorKind::Busy);
    s.add_device(soft("ns_mode0", 2), NamespaceId::INIT).unwrap();
    // Shared: devices do not move.
    assert_eq!(
        s.move_device("ns_mode0", b).unwrap_err().kind(),
        ErrorKind::NotSupported
    );
    assert_eq!(s.devices(ClientScope::Namespace(b)).len(), 1);
    s.delete_namespace(b).unwrap();
    s.set_mode(NetnsMode::Exclusive).unwrap();
}

#[test]
fn a_move_is_an_unplug_then_a_replug_as_a_new_generation() {
    let s = sub();
    let all = Arc::new(Log::default());
    let in_init = Arc::new(Log::default());
    let in_blue_log = Arc::new(Log::default());
    let blue = s.create_namespace("blue").unwrap();
    s.register_client("all", ClientScope::All, all.clone()).unwrap();
    s.register_client("init", ClientScope::Namespace(NamespaceId::INIT), in_init.clone())
        .unwrap();
    s.register_client("blue", ClientScope::Namespace(blue), in_blue_log.clone())
        .unwrap();
    let events = s.subscribe(ClientScope::Namespace(blue));
    let g1 = s.add_device(soft("ns_move0", 3), NamespaceId::INIT).unwrap().generation;
    let dev1 = s.device("ns_move0").unwrap();
    let ctx = dev1.open("app").unwrap();
    assert_eq!(
        s.move_device("ns_move0", NamespaceId::INIT).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    drop(ctx); // lets go, so the move does not wait
    let (report, info) = s.move_device("ns_move0", blue).unwrap();
    assert_eq!(
        report.reason,
        RemovalReason::NetnsMove {
            from: NamespaceId::INIT,
            to: blue
        }
    );
    assert!(report.is_clean());
    assert_eq!(info.namespace, blue);
    assert!(info.generation > g1);
    // The old instance is dead; the registry has the new one.
    assert_eq!(dev1.state(), DeviceState::Dead);
    assert_eq!(dev1.open("app").unwrap_err().kind(), ErrorKind::NoDevice);
    let dev2 = s.device("ns_move0").unwrap();
    assert!(!dev2.same_instance(&dev1));
    assert_eq!(dev2.generation(), info.generation);
    let g2 = info.generation;
    let mv = format!("(move {} -> {blue})", NamespaceId::INIT);
    assert_eq!(
        all.take(),
        [
            format!("add ns:init {g1}"),
            format!("remove ns:init {g1} {mv}"),
            format!("add {blue} {g2}")
        ]
    );
    assert_eq!(
        in_init.take(),
        [format!("add ns:init {g1}"), format!("remove ns:init {g1} {mv}")]
    );
    assert_eq!(in_blue_log.take(), [format!("add {blue} {g2}")]);
    // The blue subscriber saw only the instance in blue, with its
    // namespace, name and generation.
    let ev = events.drain();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].namespace, ev[0].device.as_str(), ev[0].generation, &ev[0].kind),
        (blue, "ns_move0", g2, &DeviceEventKind::Added)
    );
    s.shutdown();
}

#[test]
fn deleting_a_namespace_returns_its_devices_to_the_initial_one() {
    let s = sub();
    let log = Arc::new(Log::default());
    let red = s.create_namespace("red").unwrap();
    s.register_client("all", ClientScope::All, log.clone()).unwrap();
    let red_client = Arc::new(Log::default());
    s.register_client("red", ClientScope::Namespace(red), red_client.clone())
        .unwrap();
    let g1 = s.add_device(soft("ns_del0", 4), red).unwrap().generation;
    let g2 = s.add_device(soft("ns_del1", 5), red).unwrap().generation;
    log.take();
    assert_eq!(red_client.take().len(), 2);
    let weak = s.namespace_ref(red).unwrap();
    let watch = weak.watch();
    assert!(weak.is_alive() && !watch.is_deleted());
    s.delete_namespace(red).unwrap();
    assert!(!weak.is_alive());
    assert_eq!(watch.take_event(), Some(NamespaceEvent::Deleted(red)));
    assert_eq!(watch.take_event(), None);
    let infos = s.devices(ClientScope::All);
    assert_eq!(infos.len(), 2);
    assert!(infos.iter().all(|d| d.namespace == NamespaceId::INIT));
    let (n1, n2) = (infos[0].generation, infos[1].generation);
    let mv = format!("(move {red} -> ns:init)");
    assert_eq!(
        log.take(),
        [
            format!("remove {red} {g1} {mv}"),
            format!("add ns:init {n1}"),
            format!("remove {red} {g2} {mv}"),
            format!("add ns:init {n2}"),
        ]
    );
    // The red client lost both devices and sees nothing more.
    assert_eq!(
        red_client.take(),
        [format!("remove {red} {g1} {mv}"), format!("remove {red} {g2} {mv}")]
    );
    s.add_device(soft("ns_del2", 6), NamespaceId::INIT).unwrap();
    assert!(red_client.take().is_empty());
    s.shutdown();
}

#[test]
fn listeners_hold_the_namespace_weakly_and_get_one_event() {
    let s = sub();
    let ns = s.create_namespace("green").unwrap();
    let weak = s.namespace_ref(ns).unwrap();
    // Many listeners, none of which reads its event: deletion does not
    // wait for them.
    let watches: Vec<NamespaceWatch> = (0..8).map(|_| weak.watch()).collect();
    let waiter = {
        let w = weak.watch();
        thread::spawn(move || w.wait_event(Some(Duration::from_secs(10))))
    };
    s.delete_namespace(ns).unwrap();
    assert_eq!(waiter.join().unwrap(), Some(NamespaceEvent::Deleted(ns)));
    for w in &watches {
        assert!(w.is_deleted());
        assert_eq!(w.take_event(), Some(NamespaceEvent::Deleted(ns)));
        assert_eq!(w.wait_event(Some(Duration::ZERO)), None, "exactly one");
    }
    // A listener that starts watching after the deletion hears it at once.
    let late = weak.watch();
    assert_eq!(late.take_event(), Some(NamespaceEvent::Deleted(ns)));
    assert_eq!(late.namespace(), ns);
    // The initial namespace never goes.
    let init = s.namespace_ref(NamespaceId::INIT).unwrap();
    assert!(init.is_alive());
    assert_eq!(init.watch().wait_event(Some(Duration::from_millis(1))), None);
}

#[test]
fn the_global_subsystem_is_one_instance() {
    let a = Subsystem::global();
    let b = Subsystem::global();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.removal_deadline(), SubsystemConfig::default().removal_deadline);
}
