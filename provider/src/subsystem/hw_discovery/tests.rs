//! Discovery against scripted device sources, with soft devices standing
//! in for the hardware ones (the factory is the only part that needs a
//! kernel device): the diff, plug/unplug/replace, moves between namespace
//! views, shared mode, devices lost otherwise, views, the scan thread, and
//! the sysfs source on a sample host.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use super::*;
use crate::soft::SoftDeviceConfig;
use crate::subsystem::{Client, ClientScope, DeviceEventKind, DeviceRef, RemovalReason, SoftFactory, SubsystemConfig};

/// Whether this kernel has the RDMA core loaded (`ib_core`, a module or
/// built in: it has parameters, so it is under `/sys/module` either way).
/// Checked after the queries of a test, which may load it.
fn ib_core_loaded() -> bool {
    Path::new("/sys/module/ib_core").exists()
}

/// A source whose listing the test sets.
#[derive(Default)]
struct Scripted {
    devs: Mutex<Vec<PresentDevice>>,
    fail: AtomicBool,
}

impl Scripted {
    fn set(&self, devs: &[(&str, u64, &str, bool)]) {
        *lock(&self.devs) = devs
            .iter()
            .map(|(n, guid, inst, openable)| PresentDevice {
                name: n.to_string(),
                identity: Identity {
                    node_guid: Some(*guid),
                    instance: Some(inst.to_string()),
                },
                openable: *openable,
            })
            .collect();
    }
}

impl DeviceSource for Scripted {
    fn list(&self) -> io::Result<Vec<PresentDevice>> {
        if self.fail.load(Ordering::Relaxed) {
            return Err(io::Error::other("netlink went away"));
        }
        Ok(lock(&self.devs).clone())
    }

    fn follows_netns(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "scripted".to_string()
    }
}

/// Soft devices stand in for hardware: a factory per discovered name.
fn soft_maker() -> FactoryMaker {
    Box::new(|name: &str| {
        let h = name
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        let ip = IpAddr::V4(Ipv4Addr::new(127, 85, (h >> 8) as u8, h as u8 | 1));
        SoftFactory::new(SoftDeviceConfig::new(name, ip)) as Arc<dyn DeviceFactory>
    })
}

fn setup(mode: NetnsMode) -> (Arc<Subsystem>, Arc<Scripted>, Arc<HwDiscovery>) {
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(100),
        mode,
    }));
    let src = Arc::new(Scripted::default());
    let disc = HwDiscovery::with_parts(&sub, src.clone(), NetnsBindings::new(), HwEventHub::new(), soft_maker());
    (sub, src, disc)
}

fn names(sub: &Subsystem) -> Vec<(String, NamespaceId)> {
    sub.devices(ClientScope::All)
        .into_iter()
        .map(|d| (d.name, d.namespace))
        .collect()
}

fn sighting(ns: u32, guid: u64, inst: &str) -> Sighting {
    Sighting {
        ns: NamespaceId::from_u32(ns),
        identity: Identity {
            node_guid: Some(guid),
            instance: Some(inst.to_string()),
        },
    }
}

#[test]
fn diff_rules() {
    let known: BTreeMap<String, Sighting> = [
        ("gone".to_string(), sighting(0, 1, "index 1")),
        ("same".to_string(), sighting(0, 2, "index 2")),
        ("moved".to_string(), sighting(0, 3, "index 3")),
        ("reborn".to_string(), sighting(0, 4, "index 4")),
        ("hidden".to_string(), sighting(5, 5, "index 5")),
    ]
    .into();
    let seen: BTreeMap<String, Sighting> = [
        ("same".to_string(), sighting(0, 2, "index 2")),
        ("moved".to_string(), sighting(1, 3, "index 3")),
        ("reborn".to_string(), sighting(0, 4, "index 9")),
        ("new".to_string(), sighting(0, 6, "index 6")),
        ("lost".to_string(), sighting(0, 7, "index 7")),
        ("lost_then_replaced".to_string(), sighting(0, 8, "index 10")),
    ]
    .into();
    let ignored: BTreeMap<String, Identity> = [
        ("lost".to_string(), sighting(0, 7, "index 7").identity),
        ("lost_then_replaced".to_string(), sighting(0, 8, "index 8").identity),
    ]
    .into();
    // The view of ns 5 could not be listed: "hidden" stays.
    let unlisted: BTreeSet<NamespaceId> = [NamespaceId::from_u32(5)].into();
    let ns = NamespaceId::from_u32;
    assert_eq!(
        diff(&known, &seen, &ignored, &unlisted),
        [
            Change::Remove { name: "gone".into() },
            Change::Move {
                name: "moved".into(),
                from: ns(0),
                to: ns(1)
            },
            Change::Replace {
                name: "reborn".into(),
                ns: ns(0)
            },
            Change::Add {
                name: "lost_then_replaced".into(),
                ns: ns(0)
            },
            Change::Add {
                name: "new".into(),
                ns: ns(0)
            },
        ]
    );
    // Unknown identity parts match anything.
    let partial = Identity {
        node_guid: None,
        instance: Some("uverbs0".into()),
    };
    assert!(partial.same_as(&Identity {
        node_guid: Some(9),
        instance: Some("uverbs0".into())
    }));
    assert!(!partial.same_as(&Identity {
        node_guid: None,
        instance: Some("uverbs1".into())
    }));
}

#[test]
fn scans_follow_plug_unplug_and_replacement() {
    let (sub, src, disc) = setup(NetnsMode::Exclusive);
    let events = sub.subscribe(ClientScope::All);
    src.set(&[("hwd1_a", 1, "index 1", true), ("hwd1_b", 2, "index 2", true)]);
    let r = disc.scan().unwrap();
    assert_eq!((r.present, r.added.len(), r.removed.len()), (2, 2, 0), "{r}");
    assert_eq!(
        names(&sub),
        [
            ("hwd1_a".into(), NamespaceId::INIT),
            ("hwd1_b".into(), NamespaceId::INIT)
        ]
    );
    let gen_a = sub.device("hwd1_a").unwrap().generation();
    assert!(disc.scan().unwrap().changes.is_empty(), "nothing changed");

    // b is unplugged; a is re-registered (a new kernel index).
    src.set(&[("hwd1_a", 1, "index 7", true)]);
    let r = disc.scan().unwrap();
    assert_eq!(
        r.changes,
        [
            Change::Replace {
                name: "hwd1_a".into(),
                ns: NamespaceId::INIT
            },
            Change::Remove { name: "hwd1_b".into() },
        ]
    );
    assert_eq!(r.removed.len(), 2);
    assert!(r.removed.iter().all(|rep| rep.reason == RemovalReason::Unplug));
    let a = sub.device("hwd1_a").unwrap();
    assert!(a.generation() > gen_a, "a replacement is a new instance");
    assert!(sub.device("hwd1_b").is_err());

    // The uverbs node goes first when a device is unregistered.
    src.set(&[("hwd1_a", 1, "index 7", false)]);
    assert_eq!(disc.scan().unwrap().removed.len(), 1);
    assert!(names(&sub).is_empty());

    // A source that fails changes nothing.
    src.set(&[("hwd1_a", 1, "index 8", true)]);
    disc.scan().unwrap();
    src.fail.store(true, Ordering::Relaxed);
    let r = disc.scan().unwrap();
    assert!(r.changes.is_empty());
    assert!(r.errors[0].contains("netlink went away"), "{r}");
    assert_eq!(names(&sub).len(), 1);
    assert_eq!(disc.known().len(), 1);

    let kinds: Vec<String> = events
        .drain()
        .into_iter()
        .map(|e| format!("{} {:?}", e.device, std::mem::discriminant(&e.kind)))
        .collect();
    assert!(kinds.len() >= 8, "{kinds:?}");
    sub.shutdown();
}

/// A device seen in another view than before was moved between network
/// namespaces: an unplug with reason NetnsMove and a replug there.
#[test]
fn a_device_moving_between_views_is_unplugged_and_replugged() {
    let (sub, init_src, disc) = setup(NetnsMode::Exclusive);
    let blue = sub.create_namespace("blue").unwrap();
    let blue_src = Arc::new(Scripted::default());
    disc.add_view_with(blue, None, blue_src.clone()).unwrap();

    struct Seen(Mutex<Vec<String>>);
    impl Client for Seen {
        fn add(&self, d: &DeviceRef) -> crate::verbs::Result<()> {
            lock(&self.0).push(format!("add {} {}", d.name(), d.namespace()));
            Ok(())
        }
        fn remove(&self, d: &DeviceRef, why: RemovalReason) {
            lock(&self.0).push(format!("remove {} ({why})", d.name()));
        }
    }
    let seen = Arc::new(Seen(Mutex::new(Vec::new())));
    sub.register_client("seen", ClientScope::All, seen.clone()).unwrap();

    init_src.set(&[("hwd2_x", 5, "index 3", true)]);
    disc.scan().unwrap();
    // `rdma dev set hwd2_x netns blue`
    init_src.set(&[]);
    blue_src.set(&[("hwd2_x", 5, "index 3", true)]);
    let r = disc.scan().unwrap();
    assert_eq!(
        r.changes,
        [Change::Move {
            name: "hwd2_x".into(),
            from: NamespaceId::INIT,
            to: blue
        }]
    );
    assert_eq!(
        r.removed[0].reason,
        RemovalReason::NetnsMove {
            from: NamespaceId::INIT,
            to: blue
        }
    );
    assert_eq!(r.moved[0].namespace, blue);
    assert_eq!(names(&sub), [("hwd2_x".into(), blue)]);
    assert_eq!(
        *lock(&seen.0),
        [
            "add hwd2_x ns:init",
            "remove hwd2_x (move ns:init -> ns:1)",
            "add hwd2_x ns:1"
        ]
    );
    assert_eq!(disc.known()[0].1, blue);
    assert!(disc.scan().unwrap().changes.is_empty());

    // The application moves it back by hand: the discovery follows the
    // subsystem (the kernel still shows it in blue, nothing to do).
    sub.move_device("hwd2_x", NamespaceId::INIT).unwrap();
    assert!(disc.scan().unwrap().changes.is_empty());
    assert_eq!(names(&sub), [("hwd2_x".into(), NamespaceId::INIT)]);

    // Its view removed, blue's devices are no longer seen.
    disc.remove_view(blue);
    assert_eq!(disc.scan().unwrap().removed.len(), 1);
    sub.shutdown();
}

#[test]
fn shared_mode_reads_only_the_initial_view() {
    let (sub, init_src, disc) = setup(NetnsMode::Shared);
    let blue = sub.create_namespace("blue").unwrap();
    let blue_src = Arc::new(Scripted::default());
    disc.add_view_with(blue, None, blue_src.clone()).unwrap();
    init_src.set(&[("hwd3_s", 1, "index 1", true)]);
    blue_src.set(&[("hwd3_t", 2, "index 2", true)]);
    let r = disc.scan().unwrap();
    assert_eq!(r.present, 1);
    assert_eq!(names(&sub), [("hwd3_s".into(), NamespaceId::INIT)]);
    // Visible from blue too (shared).
    assert_eq!(sub.devices(ClientScope::Namespace(blue)).len(), 1);
    sub.shutdown();
}

/// A device the subsystem lost otherwise (its DEVICE_FATAL monitor, an
/// administrator) comes back only with a real replug.
#[test]
fn a_device_lost_otherwise_waits_for_a_real_replug() {
    let (sub, src, disc) = setup(NetnsMode::Exclusive);
    src.set(&[("hwd4_f", 1, "index 1", true)]);
    disc.scan().unwrap();
    sub.remove_device("hwd4_f").unwrap();
    let r = disc.scan().unwrap();
    assert!(r.changes.is_empty(), "not re-added: {:?}", r.changes);
    assert!(names(&sub).is_empty());
    // Re-registered by the kernel (new index): it is a new device.
    src.set(&[("hwd4_f", 1, "index 2", true)]);
    assert_eq!(disc.scan().unwrap().added.len(), 1);
    // Lost again; this time it vanishes and comes back unchanged.
    sub.remove_device("hwd4_f").unwrap();
    disc.scan().unwrap();
    src.set(&[]);
    disc.scan().unwrap();
    src.set(&[("hwd4_f", 1, "index 2", true)]);
    assert_eq!(disc.scan().unwrap().added.len(), 1);
    sub.shutdown();
}

/// A thread in a network namespace of its own (`unshare(CLONE_NEWNET)`),
/// alive until dropped; `None` without the privilege.
struct OtherNetns {
    path: PathBuf,
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtherNetns {
    fn new() -> Option<OtherNetns> {
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread's namespaces.
            let ok = unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
            // SAFETY: gettid has no arguments.
            let tid = unsafe { libc::gettid() };
            let _ = tx.send(ok.then(|| PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id()))));
            let _ = done_rx.recv();
        });
        match rx.recv().ok().flatten() {
            Some(path) => Some(OtherNetns {
                path,
                done: Some(done_tx),
                thread: Some(thread),
            }),
            None => {
                drop(done_tx);
                let _ = thread.join();
                None
            }
        }
    }
}

impl Drop for OtherNetns {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn views_name_real_namespaces_once() {
    let (sub, _src, disc) = setup(NetnsMode::Exclusive);
    let blue = sub.create_namespace("blue").unwrap();
    let green = sub.create_namespace("green").unwrap();
    let e = disc
        .add_view(NamespaceId::from_u32(99), Path::new("/proc/self/ns/net"))
        .unwrap_err();
    assert_eq!(e.kind(), crate::verbs::ErrorKind::NotFound);
    let e = disc.add_view(blue, Path::new("/nonexistent/netns")).unwrap_err();
    assert_eq!(e.kind(), crate::verbs::ErrorKind::NotFound);
    // Our own namespace is the initial view's, under any path.
    for p in ["/proc/self/ns/net", "/proc/thread-self/ns/net"] {
        let e = disc.add_view(blue, Path::new(p)).unwrap_err();
        assert_eq!(e.kind(), crate::verbs::ErrorKind::Busy, "{p}");
    }
    disc.remove_view(NamespaceId::INIT); // the initial view stays
    assert!(format!("{disc:?}").contains("NamespaceId(0)"));

    let Some(other) = OtherNetns::new() else {
        return println!("SKIP views of another network namespace: unshare(CLONE_NEWNET) not permitted");
    };
    disc.add_view(blue, &other.path).unwrap();
    assert_eq!(disc.bindings().path(blue).unwrap(), other.path);
    let e = disc.add_view(green, &other.path).unwrap_err();
    assert_eq!(e.kind(), crate::verbs::ErrorKind::Busy, "one namespace, one view");
    // Scanning it lists from inside it (netlink there; sysfs is refused, it
    // shows our namespace). Without an RDMA core that fails, and the failure
    // is reported for that view; with one, the listing works there (a fresh
    // namespace holds no device in exclusive mode). The initial view's
    // scripted source lists nothing.
    let r = disc.scan().unwrap();
    println!("scan with a foreign view: {r}");
    let blue_errors: Vec<&String> = r.errors.iter().filter(|e| e.starts_with(&format!("{blue} "))).collect();
    if ib_core_loaded() {
        assert!(blue_errors.is_empty(), "{r}: {:?}", r.errors);
        if read_netns_mode().is_ok_and(|(m, _)| m == NetnsMode::Exclusive) {
            assert_eq!(r.present, 0, "{r}");
        }
    } else {
        assert_eq!(r.present, 0, "{r}");
        assert_eq!(blue_errors.len(), 1, "{r}: {:?}", r.errors);
        // The netlink error from inside that namespace (no sysfs fallback
        // there): EPROTONOSUPPORT.
        let netlink_error = format!("(os error {})", libc::EPROTONOSUPPORT);
        assert!(
            blue_errors[0].contains("RDMA netlink, else sysfs") && blue_errors[0].ends_with(&netlink_error),
            "{}",
            blue_errors[0]
        );
    }
    disc.remove_view(blue);
    assert_eq!(disc.bindings().path(blue), None);
}

#[test]
fn the_scan_thread_reports_and_stops() {
    let (sub, src, disc) = setup(NetnsMode::Exclusive);
    src.set(&[("hwd5_p", 1, "index 1", true)]);
    let (tx, rx) = mpsc::channel();
    let t = disc
        .start_with(Duration::from_millis(5), move |r| {
            let _ = tx.send(r.map(|r| r.added.len()));
        })
        .unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap(), 1);
    src.set(&[]);
    let mut removed = false;
    for _ in 0..200 {
        if sub.device("hwd5_p").is_err() {
            removed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(removed, "a periodic scan noticed the unplug");
    t.stop();
    while rx.try_recv().is_ok() {}
    std::thread::sleep(Duration::from_millis(20));
    assert!(rx.try_recv().is_err(), "no scan after stop");
    let events = sub.subscribe(ClientScope::All);
    drop(disc.start(Duration::from_millis(1)).unwrap());
    assert!(events.drain().iter().all(|e| e.kind != DeviceEventKind::Added));
    sub.shutdown();
}

#[test]
fn sysfs_source_on_a_sample_host() {
    let host = crate::hw::sysfs::tests::sample_host("disc");
    host.remove("class/infiniband_verbs/uverbs2");
    let devs = SysfsSource::new(&host.0).list().unwrap();
    let summary: Vec<(&str, Option<&str>, bool)> = devs
        .iter()
        .map(|d| (d.name.as_str(), d.identity.instance.as_deref(), d.openable))
        .collect();
    assert_eq!(
        summary,
        [
            ("mlx5_0", Some("uverbs0"), true),
            ("mlx5_1", Some("uverbs1"), true),
            ("rxe0", None, false)
        ]
    );
    assert_eq!(devs[0].identity.node_guid, Some(0x248a_0703_0049_d468));
    assert!(!SysfsSource::new(&host.0).follows_netns());
    assert!(SysfsSource::new(&host.0).describe().contains("sysfs"));
}

/// On this machine, checked against what sysfs says independently. With
/// no RDMA core in the kernel (no `/sys/module/ib_core`, looked at after
/// the queries, which may load it): the mode cannot be read, with exactly
/// the netlink error `EPROTONOSUPPORT`; `sync_mode` refuses with
/// `EOPNOTSUPP` and leaves the subsystem's mode alone; the auto source
/// falls back to sysfs and lists nothing; a scan sees nothing, reports no
/// error and changes nothing. With one: the mode matches the `ib_core`
/// parameter and the subsystem follows it; the auto source lists distinct
/// devices that sysfs also shows; a scan of a fresh subsystem adds every
/// openable device it saw, or says why not.
#[test]
fn the_real_kernel_agrees_with_sysfs() {
    let mode = read_netns_mode();
    let listed = AutoSource::default().list();
    let (sub, _src, disc) = setup(NetnsMode::Exclusive);
    let synced = disc.sync_mode();
    let real = HwDiscovery::new(&sub);
    let r = real.scan().unwrap();
    println!("real scan: {r}");
    if !ib_core_loaded() {
        let e = mode.expect_err("a netns mode without an RDMA core in the kernel");
        assert_eq!(e.raw_os_error(), Some(libc::EPROTONOSUPPORT), "{e}");
        let e = synced.expect_err("sync_mode without an RDMA core");
        assert_eq!(e.kind(), crate::verbs::ErrorKind::NotSupported, "{e}");
        assert_eq!(sub.mode(), NetnsMode::Exclusive, "a failed sync changed the mode");
        // No kernel device: the auto source lists what libibverbs itself
        // lists — nothing with rdma-core's library, the soft devices of
        // softverbs' own libibverbs.so.1 — and the scan adds exactly those.
        let listed = listed.expect("the fallbacks list");
        let own: Vec<String> = VerbsSource
            .list()
            .map(|v| v.into_iter().map(|d| d.name).collect())
            .unwrap_or_default();
        let listed_names: Vec<String> = listed.iter().map(|d| d.name.clone()).collect();
        assert_eq!(listed_names, own, "{listed:?}");
        assert_eq!(
            (
                r.present,
                r.changes.len(),
                r.added.len(),
                r.removed.len(),
                r.moved.len()
            ),
            (own.len(), own.len(), own.len(), 0, 0),
            "{r}"
        );
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let mut added: Vec<String> = r.added.iter().map(|a| a.name.clone()).collect();
        added.sort();
        let mut own_sorted = own.clone();
        own_sorted.sort();
        assert_eq!(added, own_sorted, "{r}");
        let mut present: Vec<String> = names(&sub).into_iter().map(|(n, _)| n).collect();
        present.sort();
        assert_eq!(present, own_sorted);
        println!("no RDMA core in this kernel: libibverbs' own devices {own:?}, nothing else read or changed");
        return;
    }
    let (m, from) = mode.expect("the netns mode with ib_core loaded");
    if let Ok(param) = crate::hw::sysfs::netns_mode(Path::new("/sys")) {
        assert_eq!(m, param, "read from {from:?}, the ib_core parameter says otherwise");
    }
    assert_eq!(synced.expect("sync_mode"), m);
    assert_eq!(sub.mode(), m);
    let listed = listed.expect("the auto source lists with ib_core loaded");
    let mut seen = std::collections::BTreeSet::new();
    for d in &listed {
        assert!(seen.insert(d.name.clone()), "{} listed twice", d.name);
        assert!(
            Path::new("/sys/class/infiniband").join(&d.name).exists(),
            "{} is not in /sys/class/infiniband",
            d.name
        );
    }
    let openable = listed.iter().filter(|d| d.openable).count();
    assert_eq!(r.present, openable, "{r}");
    assert!(
        r.added.len() == r.present || !r.errors.is_empty(),
        "{r}: saw {} openable device(s), added {:?} and reported no error",
        r.present,
        r.added
    );
    for a in &r.added {
        assert!(seen.contains(&a.name), "added {} which nothing listed", a.name);
    }
    println!("RDMA netns mode {m} (from {from:?}); {} device(s) listed", listed.len());
}
