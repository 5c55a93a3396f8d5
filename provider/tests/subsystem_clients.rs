//! Clients of the device subsystem: upcall order, failing adds, the
//! unregister fence, scopes, and upcalls that call back into the subsystem.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::*;
use softverbs::verbs::{self, ErrorKind, Verb};

type Log = Arc<Mutex<Vec<String>>>;
type AddHook = Box<dyn Fn(&DeviceRef) -> verbs::Result<()> + Send + Sync>;
type RemoveHook = Box<dyn Fn(&DeviceRef, RemovalReason) + Send + Sync>;

/// Logs every upcall as "NAME add|remove DEVICE", then runs its hooks.
struct Recorder {
    name: String,
    log: Log,
    on_add: Option<AddHook>,
    on_remove: Option<RemoveHook>,
}

impl Recorder {
    fn new(name: &str, log: &Log) -> Recorder {
        Recorder {
            name: name.to_string(),
            log: log.clone(),
            on_add: None,
            on_remove: None,
        }
    }

    fn on_add(mut self, f: impl Fn(&DeviceRef) -> verbs::Result<()> + Send + Sync + 'static) -> Self {
        self.on_add = Some(Box::new(f));
        self
    }

    fn on_remove(mut self, f: impl Fn(&DeviceRef, RemovalReason) + Send + Sync + 'static) -> Self {
        self.on_remove = Some(Box::new(f));
        self
    }
}

impl Client for Recorder {
    fn add(&self, d: &DeviceRef) -> verbs::Result<()> {
        self.log.lock().unwrap().push(format!("{} add {}", self.name, d.name()));
        match &self.on_add {
            Some(f) => f(d),
            None => Ok(()),
        }
    }

    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} remove {}", self.name, d.name()));
        if let Some(f) = &self.on_remove {
            f(d, why);
        }
    }
}

fn soft(name: &str, last: u8) -> Arc<SoftFactory> {
    SoftFactory::new(SoftDeviceConfig {
        link: Some(InprocFabric::new()),
        ..SoftDeviceConfig::new(name, format!("10.61.0.{last}").parse().unwrap())
    })
}

fn take(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

fn sub() -> Arc<Subsystem> {
    Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }))
}

#[test]
fn add_in_registration_order_remove_in_reverse() {
    let s = sub();
    let log = Log::default();
    for n in ["a", "b", "c"] {
        s.register_client(n, ClientScope::All, Arc::new(Recorder::new(n, &log)))
            .unwrap();
    }
    s.add_device(soft("cl_order0", 1), NamespaceId::INIT).unwrap();
    assert_eq!(take(&log), ["a add cl_order0", "b add cl_order0", "c add cl_order0"]);
    let r = s.remove_device("cl_order0").unwrap();
    assert_eq!(
        take(&log),
        ["c remove cl_order0", "b remove cl_order0", "a remove cl_order0"]
    );
    assert_eq!(r.removed_clients, ["c", "b", "a"]);
    assert!(r.is_clean());
    assert_eq!(s.remove_device("cl_order0").unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn a_client_registered_late_is_added_to_every_present_device() {
    let s = sub();
    let log = Log::default();
    s.add_device(soft("cl_late0", 2), NamespaceId::INIT).unwrap();
    s.add_device(soft("cl_late1", 3), NamespaceId::INIT).unwrap();
    let id = s
        .register_client("late", ClientScope::All, Arc::new(Recorder::new("late", &log)))
        .unwrap();
    assert_eq!(take(&log), ["late add cl_late0", "late add cl_late1"]);
    s.unregister_client(id).unwrap();
    // Unregistering removes every device, the most recent first.
    assert_eq!(take(&log), ["late remove cl_late1", "late remove cl_late0"]);
    s.shutdown();
    assert!(take(&log).is_empty());
}

#[test]
fn a_failing_or_panicking_add_gets_no_remove() {
    let s = sub();
    let log = Log::default();
    let fails = Recorder::new("fails", &log).on_add(|_| {
        Err(verbs::Error::new(
            Verb::OpenDevice,
            ErrorKind::NotSupported,
            "no thanks",
        ))
    });
    let panics = Recorder::new("panics", &log).on_add(|_| panic!("client bug"));
    s.register_client("fails", ClientScope::All, Arc::new(fails)).unwrap();
    s.register_client("panics", ClientScope::All, Arc::new(panics)).unwrap();
    s.register_client("ok", ClientScope::All, Arc::new(Recorder::new("ok", &log)))
        .unwrap();
    s.add_device(soft("cl_fail0", 4), NamespaceId::INIT).unwrap();
    s.remove_device("cl_fail0").unwrap();
    assert_eq!(
        take(&log),
        [
            "fails add cl_fail0",
            "panics add cl_fail0",
            "ok add cl_fail0",
            "ok remove cl_fail0"
        ]
    );
}

#[test]
fn generation_changes_on_every_re_add_and_events_carry_it() {
    let s = sub();
    let events = s.subscribe(ClientScope::All);
    let g1 = s.add_device(soft("cl_gen0", 5), NamespaceId::INIT).unwrap().generation;
    s.remove_device("cl_gen0").unwrap();
    let g2 = s.add_device(soft("cl_gen0", 5), NamespaceId::INIT).unwrap().generation;
    assert!(g2 > g1);
    s.remove_device("cl_gen0").unwrap();
    let got: Vec<(String, Generation, NamespaceId, &str)> = events
        .drain()
        .into_iter()
        .map(|e| {
            let k = match e.kind {
                DeviceEventKind::Added => "added",
                DeviceEventKind::Removing(_) => "removing",
                DeviceEventKind::Removed { .. } => "removed",
            };
            (e.device, e.generation, e.namespace, k)
        })
        .collect();
    let n = |g, k| ("cl_gen0".to_string(), g, NamespaceId::INIT, k);
    assert_eq!(
        got,
        [
            n(g1, "added"),
            n(g1, "removing"),
            n(g1, "removed"),
            n(g2, "added"),
            n(g2, "removing"),
            n(g2, "removed")
        ]
    );
}

#[test]
fn unregister_is_a_fence_against_upcalls_on_another_thread() {
    let s = sub();
    let log = Log::default();
    let inside = Arc::new(AtomicBool::new(false));
    let flag = inside.clone();
    let slow = Recorder::new("slow", &log).on_add(move |_| {
        flag.store(true, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(50));
        Ok(())
    });
    let id = s.register_client("slow", ClientScope::All, Arc::new(slow)).unwrap();
    let s2 = s.clone();
    let adder = thread::spawn(move || s2.add_device(soft("cl_fence0", 6), NamespaceId::INIT).unwrap());
    while !inside.load(Ordering::SeqCst) {
        thread::yield_now();
    }
    // The add upcall is running on the other thread: unregister waits for
    // it, then removes the device from the client, then returns.
    s.unregister_client(id).unwrap();
    let at_return = take(&log);
    assert_eq!(at_return, ["slow add cl_fence0", "slow remove cl_fence0"]);
    adder.join().unwrap();
    s.remove_device("cl_fence0").unwrap();
    s.add_device(soft("cl_fence0", 6), NamespaceId::INIT).unwrap();
    s.shutdown();
    assert!(take(&log).is_empty(), "no upcall after unregister returned");
    assert_eq!(s.unregister_client(id).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn upcalls_call_back_into_the_subsystem() {
    let s = sub();
    let log = Log::default();
    let late_id: Arc<OnceLock<ClientId>> = Arc::default();
    let me: Arc<OnceLock<ClientId>> = Arc::default();
    // "outer" registers "inner" from its first add, opens the device, looks
    // devices up, and tries to unregister itself (EBUSY).
    let (s2, log2, late2, me2) = (s.clone(), log.clone(), late_id.clone(), me.clone());
    let outer = Recorder::new("outer", &log).on_add(move |d| {
        assert_eq!(s2.devices(ClientScope::All).len(), 1);
        let ctx = d.open("outer")?;
        assert_eq!(ctx.device_name(), d.name());
        drop(ctx);
        let err = s2.unregister_client(*me2.get().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy);
        if late2.get().is_none() {
            let id = s2
                .register_client("inner", ClientScope::All, Arc::new(Recorder::new("inner", &log2)))
                .unwrap();
            late2.set(id).unwrap();
        }
        Ok(())
    });
    let id = s.register_client("outer", ClientScope::All, Arc::new(outer)).unwrap();
    me.set(id).unwrap();
    s.add_device(soft("cl_reent0", 7), NamespaceId::INIT).unwrap();
    // "inner" registered during outer's add (registered later) is added after it.
    assert_eq!(take(&log), ["outer add cl_reent0", "inner add cl_reent0"]);
    // A remove upcall that unregisters another client: that client gets its
    // remove once, from the unregister.
    let (s3, late3) = (s.clone(), late_id.clone());
    let killer = Recorder::new("killer", &log).on_remove(move |_, _| {
        s3.unregister_client(*late3.get().unwrap()).unwrap();
    });
    s.register_client("killer", ClientScope::All, Arc::new(killer)).unwrap();
    assert_eq!(take(&log), ["killer add cl_reent0"]);
    s.remove_device("cl_reent0").unwrap();
    assert_eq!(
        take(&log),
        [
            "killer remove cl_reent0",
            "inner remove cl_reent0",
            "outer remove cl_reent0"
        ]
    );
}

#[test]
fn an_add_upcall_that_removes_its_device_gets_its_remove_at_once() {
    let s = sub();
    let log = Log::default();
    let s2 = s.clone();
    let first = Recorder::new("first", &log);
    let remover = Recorder::new("remover", &log).on_add(move |d| {
        let r = s2.remove_device(d.name()).unwrap();
        assert_eq!(r.removed_clients, ["first"]);
        assert_eq!(d.state(), DeviceState::Dead);
        // It is gone: removing it again is ENOENT.
        assert_eq!(s2.remove_device(d.name()).unwrap_err().kind(), ErrorKind::NotFound);
        Ok(())
    });
    let last = Recorder::new("last", &log);
    s.register_client("first", ClientScope::All, Arc::new(first)).unwrap();
    s.register_client("remover", ClientScope::All, Arc::new(remover))
        .unwrap();
    s.register_client("last", ClientScope::All, Arc::new(last)).unwrap();
    s.add_device(soft("cl_self0", 8), NamespaceId::INIT).unwrap();
    assert_eq!(
        take(&log),
        [
            "first add cl_self0",
            "remover add cl_self0",
            "first remove cl_self0",
            "remover remove cl_self0"
        ]
    );
    assert!(s.devices(ClientScope::All).is_empty());
}

#[test]
fn removing_a_device_from_its_own_remove_upcall_is_ebusy() {
    let s = sub();
    let log = Log::default();
    let s2 = s.clone();
    let c = Recorder::new("c", &log).on_remove(move |d, why| {
        assert_eq!(why, RemovalReason::Unplug);
        assert_eq!(d.removal_reason(), Some(RemovalReason::Unplug));
        assert_eq!(s2.remove_device(d.name()).unwrap_err().kind(), ErrorKind::Busy);
        assert_eq!(d.open("c").unwrap_err().kind(), ErrorKind::NoDevice);
    });
    s.register_client("c", ClientScope::All, Arc::new(c)).unwrap();
    s.add_device(soft("cl_busy0", 9), NamespaceId::INIT).unwrap();
    s.remove_device("cl_busy0").unwrap();
    assert_eq!(take(&log), ["c add cl_busy0", "c remove cl_busy0"]);
}

#[test]
fn a_client_for_one_namespace_sees_only_its_devices_until_shared_mode() {
    let s = sub();
    let log = Log::default();
    let blue = s.create_namespace("blue").unwrap();
    s.register_client("all", ClientScope::All, Arc::new(Recorder::new("all", &log)))
        .unwrap();
    s.register_client(
        "blue",
        ClientScope::Namespace(blue),
        Arc::new(Recorder::new("blue", &log)),
    )
    .unwrap();
    s.register_client(
        "init",
        ClientScope::Namespace(NamespaceId::INIT),
        Arc::new(Recorder::new("init", &log)),
    )
    .unwrap();
    s.add_device(soft("cl_scope0", 10), NamespaceId::INIT).unwrap();
    s.add_device(soft("cl_scope1", 11), blue).unwrap();
    assert_eq!(
        take(&log),
        [
            "all add cl_scope0",
            "init add cl_scope0",
            "all add cl_scope1",
            "blue add cl_scope1"
        ]
    );
    assert_eq!(s.devices(ClientScope::Namespace(blue)).len(), 1);
    assert_eq!(s.devices(ClientScope::All).len(), 2);
    s.shutdown();
    take(&log);
    // Shared mode: every device visible everywhere (EBUSY first, while
    // "blue" exists).
    assert_eq!(s.set_mode(NetnsMode::Shared).unwrap_err().kind(), ErrorKind::Busy);
    s.delete_namespace(blue).unwrap();
    s.set_mode(NetnsMode::Shared).unwrap();
    let green = s.create_namespace("green").unwrap();
    s.register_client(
        "green",
        ClientScope::Namespace(green),
        Arc::new(Recorder::new("green", &log)),
    )
    .unwrap();
    s.add_device(soft("cl_scope2", 12), NamespaceId::INIT).unwrap();
    assert_eq!(
        s.add_device(soft("cl_scope3", 13), green).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        take(&log),
        ["all add cl_scope2", "init add cl_scope2", "green add cl_scope2"]
    );
    // Deleting green in shared mode: its client loses the device, which
    // lives on for everyone else.
    s.delete_namespace(green).unwrap();
    assert_eq!(take(&log), ["green remove cl_scope2"]);
    assert_eq!(s.device("cl_scope2").unwrap().state(), DeviceState::Live);
    s.shutdown();
    assert_eq!(take(&log), ["init remove cl_scope2", "all remove cl_scope2"]);
}
