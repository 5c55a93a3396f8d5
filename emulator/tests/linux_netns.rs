//! The Linux namespace driver on real network namespaces and veth pairs:
//! devices follow their interfaces (moved by the driver or by `ip`), an
//! interface deleted is a hot-unplug, link down/up are port events, and
//! deleting a namespace brings interfaces home or unplugs their devices.
//!
//! Needs root and `ip` (iproute2); prints one `skipping:` line otherwise.
//! Every test uses names of its own (process id + a tag) and removes its
//! namespaces and interfaces on every path (a drop guard).

#![cfg(target_os = "linux")]

use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::subsystem::{
    ClientScope, DeviceEvent, DeviceEventKind, EventReceiver, NamespaceId, RemovalReason, Subsystem, SubsystemConfig,
};
use softverbs::verbs::*;
use softverbs_emulator::netns::traffic::{connect_rc, first_gid, RcLoop};
use softverbs_emulator::netns::{LinuxNetns, NetnsDriver, INIT_NETNS};

/// The tests take turns: each moves interfaces between namespaces and then
/// checks RC traffic with the usual retry budget (7 tries of 67 ms), and
/// several of them moving interfaces and re-making sockets at once on a
/// loaded 2-core machine starved one another's traffic past it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Generous bound for anything to happen (never reached unless broken; the
/// machine may be loaded).
const PATIENCE: Duration = Duration::from_secs(60);

fn ip(args: &[&str]) -> std::result::Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes what a test made, whatever happened to it.
struct Cleanup {
    netns: Vec<String>,
    links: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = ip(&["link", "del", l]);
        }
        for n in &self.netns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// One test's world: names, addresses, a subsystem and the driver.
struct Env {
    // Field order is drop order: the driver and the subsystem (and the
    // sockets of their devices) go before the cleanup runs.
    drv: LinuxNetns,
    sub: Arc<Subsystem>,
    /// veth ends `a` and `b` and the namespaces this test may use.
    a: String,
    b: String,
    ns1: String,
    ns2: String,
    addr_a: IpAddr,
    addr_b: IpAddr,
    tag: String,
    _cleanup: Cleanup,
}

impl Env {
    /// `None` (after printing why) where the driver cannot run.
    fn new(tag: &str, subnet: u8) -> Option<Env> {
        if let Err(why) = LinuxNetns::check_privileges() {
            println!("skipping: linux netns driver needs root and ip netns ({why})");
            return None;
        }
        if let Err(why) = ip(&["-V"]) {
            println!("skipping: linux netns driver tests need iproute2 ({why})");
            return None;
        }
        let pid = std::process::id() % 100_000;
        let (a, b) = (format!("sv{pid}{tag}a"), format!("sv{pid}{tag}b"));
        let (ns1, ns2) = (format!("svln{pid}{tag}1"), format!("svln{pid}{tag}2"));
        let third = (std::process::id() % 250) as u8 + 1;
        let cleanup = Cleanup {
            netns: vec![ns1.clone(), ns2.clone()],
            links: vec![a.clone(), b.clone()],
        };
        // Leftovers of an earlier run with the same pid.
        drop(Cleanup {
            netns: cleanup.netns.clone(),
            links: cleanup.links.clone(),
        });
        let sub = Arc::new(Subsystem::new(SubsystemConfig {
            removal_deadline: Duration::from_millis(500),
            ..SubsystemConfig::default()
        }));
        let drv = LinuxNetns::new(sub.clone()).expect("driver");
        Some(Env {
            drv,
            sub,
            a,
            b,
            ns1,
            ns2,
            addr_a: IpAddr::from([10, subnet, third, 1]),
            addr_b: IpAddr::from([10, subnet, third, 2]),
            tag: format!("{pid}{tag}"),
            _cleanup: cleanup,
        })
    }

    /// The veth pair `a` ↔ `b`, with devices `dev("a")` and `dev("b")`.
    fn pair_with_devices(&self) {
        self.drv.add_veth(&self.a, self.addr_a, &self.b, self.addr_b).unwrap();
        self.drv.add_device(&self.dev("a"), &self.a).unwrap();
        self.drv.add_device(&self.dev("b"), &self.b).unwrap();
    }

    fn dev(&self, end: &str) -> String {
        format!("lnx{}{end}", self.tag)
    }

    /// Calls `sync` until `done` holds.
    fn sync_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let end = Instant::now() + PATIENCE;
        loop {
            self.drv.sync().unwrap();
            if done() {
                return;
            }
            assert!(Instant::now() < end, "gave up waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The events of device `name` queued now.
fn events_of(rx: &EventReceiver, name: &str) -> Vec<DeviceEvent> {
    rx.drain().into_iter().filter(|e| e.device == name).collect()
}

/// A QP with its CQ, buffer and context, on one device.
struct Side {
    // Field order is drop order.
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
    ctx: Context,
}

fn side(sub: &Subsystem, device: &str) -> Side {
    let ctx = sub.open(device, "linux_netns test").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    Side {
        qp,
        cq,
        mr,
        _pd: pd,
        ctx,
    }
}

/// An RC connection between devices `a` and `b`; `a` sends a message to
/// `b`. Returns the message as `b` received it.
fn rc_send(sub: &Subsystem, a: &str, b: &str, msg: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let (sa, sb) = (side(sub, a), side(sub, b));
    connect_rc(&sa.qp, first_gid(&sb.ctx).unwrap(), sb.qp.qp_num(), 0x10, 0x20).map_err(|e| e.to_string())?;
    connect_rc(&sb.qp, first_gid(&sa.ctx).unwrap(), sa.qp.qp_num(), 0x20, 0x10).map_err(|e| e.to_string())?;
    sb.qp
        .post_recv(&[RecvWr::new(1, &[sb.mr.sge(0, 4096).unwrap()])])
        .map_err(|e| e.to_string())?;
    sa.mr.write(0, msg).unwrap();
    let sge = [sa.mr.sge(0, msg.len() as u32).unwrap()];
    sa.qp
        .post_send(&[SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .map_err(|e| e.to_string())?;
    let (mut sent, mut got) = (None, None);
    let mut wc = [WorkCompletion::default(); 4];
    let end = Instant::now() + PATIENCE;
    while sent.is_none() || got.is_none() {
        if Instant::now() > end {
            return Err(format!("no completion (send {sent:?}, receive {got:?})"));
        }
        // Inline engines: polling drives each device (its socket, its timers).
        let n = sa.cq.poll(&mut wc).unwrap();
        if let Some(w) = wc[..n].last() {
            sent = Some(w.status);
        }
        let n = sb.cq.poll(&mut wc).unwrap();
        if let Some(w) = wc[..n].last() {
            got = Some((w.status, w.byte_len));
        }
        std::thread::yield_now();
    }
    if sent != Some(WcStatus::Success) || got.map(|g| g.0) != Some(WcStatus::Success) {
        return Err(format!("send {sent:?}, receive {got:?}"));
    }
    let mut buf = vec![0u8; got.unwrap().1 as usize];
    sb.mr.read(0, &mut buf).unwrap();
    Ok(buf)
}

fn assert_traffic(env: &Env) {
    let msg = format!("hello from {} across namespaces", env.dev("a"));
    let got = rc_send(&env.sub, &env.dev("a"), &env.dev("b"), msg.as_bytes()).expect("RC send a -> b");
    assert_eq!(got, msg.as_bytes());
    let got = rc_send(&env.sub, &env.dev("b"), &env.dev("a"), b"and back").expect("RC send b -> a");
    assert_eq!(got, b"and back");
}

/// The removal of `name` for `reason` was reported, and its re-add in `to`.
fn assert_moved(rx: &EventReceiver, name: &str, reason: RemovalReason, to: NamespaceId) {
    let ev = events_of(rx, name);
    let kinds: Vec<&DeviceEventKind> = ev.iter().map(|e| &e.kind).collect();
    assert!(
        ev.iter()
            .any(|e| matches!(&e.kind, DeviceEventKind::Removed { reason: r, .. } if *r == reason)),
        "{kinds:?}"
    );
    assert!(
        ev.iter().any(|e| e.kind == DeviceEventKind::Added && e.namespace == to),
        "{kinds:?}"
    );
}

#[test]
fn device_follows_link_set_netns_and_carries_traffic() {
    let _serial = serial();
    let Some(env) = Env::new("m", 211) else { return };
    env.pair_with_devices();
    let (da, db) = (env.dev("a"), env.dev("b"));
    assert_eq!(env.drv.kind(), "linux");
    assert_eq!(env.drv.device_link(&da).as_deref(), Some(env.a.as_str()));
    assert_traffic(&env);

    // Work posted before the move, not yet completed.
    let mut lp = RcLoop::new(env.sub.open(&da, "rcloop").unwrap(), 16).unwrap();
    assert_eq!(lp.post(8), 8);
    let rx = env.sub.subscribe(ClientScope::All);
    let before = env.sub.device(&da).unwrap().generation();
    let ns1 = env.drv.add_netns(&env.ns1).unwrap();
    assert_eq!(env.sub.namespace_by_name(&env.ns1), Some(ns1));
    assert!(std::path::Path::new("/run/netns").join(&env.ns1).exists());
    env.drv.link_set_netns(&env.a, &env.ns1).unwrap();

    // The interface really moved, and kept (got back) its address.
    ip(&["-n", &env.ns1, "addr", "show", "dev", &env.a]).expect("the interface is in the namespace");
    assert!(
        ip(&["link", "show", "dev", &env.a]).is_err(),
        "still in the initial namespace"
    );
    assert_eq!(env.drv.link_netns(&env.a), Some(ns1));
    let moved = env.sub.device(&da).unwrap();
    assert_eq!(moved.namespace(), ns1);
    assert!(moved.generation() > before);
    assert_moved(
        &rx,
        &da,
        RemovalReason::NetnsMove {
            from: NamespaceId::INIT,
            to: ns1,
        },
        ns1,
    );
    assert_eq!(env.sub.devices(ClientScope::Namespace(ns1)).len(), 1);

    // Every WR posted before the move completed exactly once.
    assert!(lp.settle(PATIENCE), "{:?}", lp.ledger());
    lp.ledger().check().unwrap();
    assert_eq!(lp.ledger().completed, 16);
    drop(lp);

    // The new instance's GID comes from the interface's address in its new
    // namespace (4791 is free there: the standard GID).
    let ctx = env.sub.open(&da, "gid").unwrap();
    assert_eq!(first_gid(&ctx).unwrap().1, Gid::from_ip(env.addr_a));
    drop(ctx);
    // Its sockets are in the new namespace: traffic to the peer in the
    // initial namespace crosses the veth.
    assert_traffic(&env);

    // Moving to where it is changes nothing.
    let g = env.sub.device(&da).unwrap().generation();
    env.drv.link_set_netns(&env.a, &env.ns1).unwrap();
    assert_eq!(env.sub.device(&da).unwrap().generation(), g);
    assert_eq!(env.drv.sync().unwrap(), 0);

    // Errors.
    let kind = |r: softverbs::subsystem::Result<()>| r.unwrap_err().kind();
    assert_eq!(
        kind(env.drv.link_set_netns("nosuchif0", INIT_NETNS)),
        ErrorKind::NotFound
    );
    assert_eq!(kind(env.drv.link_set_netns(&env.a, "nowhere")), ErrorKind::NotFound);
    assert_eq!(env.drv.add_netns(&env.ns1).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(env.drv.add_device("x", &env.a).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(
        kind(env.drv.add_link(&env.b, "10.9.9.9".parse().unwrap())),
        ErrorKind::Busy
    );
    assert_eq!(
        kind(env.drv.add_link("averylongname16", "10.9.9.9".parse().unwrap())),
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(env.drv.del_netns(INIT_NETNS)), ErrorKind::PermissionDenied);

    env.drv.del_device(&db).unwrap();
    env.drv.del_netns(&env.ns1).unwrap();
    env.drv.del_link(&env.a).unwrap();
    assert!(env.sub.devices(ClientScope::All).is_empty());
    assert!(env.drv.links().is_empty());
}

#[test]
fn interface_moved_by_ip_is_followed_after_sync() {
    let _serial = serial();
    let Some(env) = Env::new("x", 212) else { return };
    env.pair_with_devices();
    let da = env.dev("a");
    // A namespace made outside, adopted by the driver.
    ip(&["netns", "add", &env.ns1]).unwrap();
    let ns1 = env.drv.add_netns(&env.ns1).unwrap();
    let rx = env.sub.subscribe(ClientScope::All);
    let before = env.sub.device(&da).unwrap().generation();

    ip(&["link", "set", "dev", &env.a, "netns", &env.ns1]).unwrap();
    // Nothing changes until the driver looks.
    assert_eq!(env.sub.device(&da).unwrap().namespace(), NamespaceId::INIT);
    assert!(env.drv.sync().unwrap() >= 1);
    let moved = env.sub.device(&da).unwrap();
    assert_eq!(moved.namespace(), ns1);
    assert!(moved.generation() > before);
    assert_eq!(env.drv.link_netns(&env.a), Some(ns1));
    assert_moved(
        &rx,
        &da,
        RemovalReason::NetnsMove {
            from: NamespaceId::INIT,
            to: ns1,
        },
        ns1,
    );
    // The driver gave the interface its address back and brought it up.
    assert_traffic(&env);
    assert_eq!(env.drv.sync().unwrap(), 0);
    // And back, the same way.
    let me = std::process::id().to_string();
    ip(&["-n", &env.ns1, "link", "set", "dev", &env.a, "netns", &me]).unwrap();
    env.sync_until("the move home", || {
        env.sub.device(&da).is_ok_and(|d| d.namespace() == NamespaceId::INIT)
    });
    assert_traffic(&env);
    env.drv.del_netns(&env.ns1).unwrap();
    env.sub.shutdown();
}

#[test]
fn interface_deleted_is_a_hot_unplug() {
    let _serial = serial();
    let Some(env) = Env::new("d", 213) else { return };
    env.pair_with_devices();
    let (da, db) = (env.dev("a"), env.dev("b"));
    let mut lp = RcLoop::new(env.sub.open(&da, "rcloop").unwrap(), 16).unwrap();
    assert_eq!(lp.post(8), 8);
    let rx = env.sub.subscribe(ClientScope::All);

    ip(&["link", "del", "dev", &env.a]).unwrap();
    assert!(env.drv.sync().unwrap() >= 2);
    // Both ends are gone (deleting a veth end deletes its peer): both
    // devices were unplugged.
    let events = rx.drain();
    for d in [&da, &db] {
        assert_eq!(env.sub.device(d).unwrap_err().kind(), ErrorKind::NotFound);
        let ev: Vec<&DeviceEvent> = events.iter().filter(|e| e.device == **d).collect();
        assert!(
            ev.iter().any(|e| matches!(
                e.kind,
                DeviceEventKind::Removed {
                    reason: RemovalReason::Unplug,
                    ..
                }
            )),
            "{d}: {ev:?}"
        );
    }
    assert!(env.drv.links().is_empty());
    assert!(lp.settle(PATIENCE), "{:?}", lp.ledger());
    lp.ledger().check().unwrap();
    // The removal sequence ran on the old device: control verbs fail.
    assert_eq!(lp.context().alloc_pd().unwrap_err().kind(), ErrorKind::NoDevice);
    lp.destroy().unwrap();
}

#[test]
fn link_down_and_up_are_port_events() {
    let _serial = serial();
    let Some(env) = Env::new("p", 214) else { return };
    env.pair_with_devices();
    let da = env.dev("a");
    let ctx = env.sub.open(&da, "port watcher").unwrap();
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
    assert_eq!(env.drv.link_port_active(&env.a), Some(true));

    let expect = |want: EventType, state: PortState| {
        let mut seen = Vec::new();
        env.sync_until(&format!("{want}"), || {
            while let Some(ev) = ctx.get_async_event(Some(Duration::from_millis(10))).unwrap() {
                seen.push(ev);
            }
            !seen.is_empty()
        });
        assert_eq!(
            seen,
            [AsyncEvent {
                event_type: want,
                element: AsyncElement::Port(1)
            }]
        );
        assert_eq!(ctx.query_port(1).unwrap().state, state);
    };
    ip(&["link", "set", "dev", &env.a, "down"]).unwrap();
    expect(EventType::PortErr, PortState::Down);
    assert_eq!(env.drv.link_port_active(&env.a), Some(false));
    ip(&["link", "set", "dev", &env.a, "up"]).unwrap();
    expect(EventType::PortActive, PortState::Active);
    // The peer going down takes the carrier away: the port goes down too.
    ip(&["link", "set", "dev", &env.b, "down"]).unwrap();
    expect(EventType::PortErr, PortState::Down);
    ip(&["link", "set", "dev", &env.b, "up"]).unwrap();
    expect(EventType::PortActive, PortState::Active);
    // The device stayed the same instance throughout.
    assert_eq!(env.sub.devices(ClientScope::All).len(), 2);
    drop(ctx);
    env.sub.shutdown();
}

#[test]
fn deleting_a_namespace_brings_interfaces_home_or_unplugs() {
    let _serial = serial();
    let Some(env) = Env::new("n", 215) else { return };
    env.pair_with_devices();
    let (da, db) = (env.dev("a"), env.dev("b"));
    let rx = env.sub.subscribe(ClientScope::All);

    // Through the driver: the interface and its device come home.
    let ns1 = env.drv.add_netns(&env.ns1).unwrap();
    env.drv.link_set_netns(&env.a, &env.ns1).unwrap();
    let watch = env.sub.namespace_ref(ns1).unwrap().watch();
    rx.drain();
    env.drv.del_netns(&env.ns1).unwrap();
    assert!(watch.is_deleted());
    assert_eq!(env.drv.netns(&env.ns1), None);
    assert!(!std::path::Path::new("/run/netns").join(&env.ns1).exists());
    assert_eq!(env.drv.link_netns(&env.a), Some(NamespaceId::INIT));
    assert_eq!(env.sub.device(&da).unwrap().namespace(), NamespaceId::INIT);
    assert_moved(
        &rx,
        &da,
        RemovalReason::NetnsMove {
            from: ns1,
            to: NamespaceId::INIT,
        },
        NamespaceId::INIT,
    );
    assert_traffic(&env);

    // Outside (`ip netns del`): the device in it is unplugged; the kernel
    // then destroys the veth (and its peer), and the peer's device goes too.
    let ns2 = env.drv.add_netns(&env.ns2).unwrap();
    env.drv.link_set_netns(&env.a, &env.ns2).unwrap();
    ip(&["netns", "del", &env.ns2]).unwrap();
    assert!(env.drv.sync().unwrap() >= 2);
    assert_eq!(env.drv.netns(&env.ns2), None);
    assert_eq!(env.sub.namespace_by_name(&env.ns2), None);
    assert!(env.sub.namespace_ref(ns2).is_err());
    assert_eq!(env.sub.device(&da).unwrap_err().kind(), ErrorKind::NotFound);
    env.sync_until("the veth peer's destruction", || env.sub.device(&db).is_err());
    assert!(env.drv.links().is_empty());
    assert!(env.sub.devices(ClientScope::All).is_empty());
}

#[test]
fn shared_mode_keeps_devices_home_but_remakes_their_sockets() {
    let _serial = serial();
    let Some(env) = Env::new("s", 216) else { return };
    env.drv.set_mode(softverbs::subsystem::NetnsMode::Shared).unwrap();
    env.pair_with_devices();
    let da = env.dev("a");
    let ns1 = env.drv.add_netns(&env.ns1).unwrap();
    let before = env.sub.device(&da).unwrap().generation();
    env.drv.link_set_netns(&env.a, &env.ns1).unwrap();
    assert_eq!(env.drv.link_netns(&env.a), Some(ns1));
    // Still in the initial namespace (visible everywhere), but a new
    // instance whose sockets were made where the interface is now.
    let d = env.sub.device(&da).unwrap();
    assert_eq!(d.namespace(), NamespaceId::INIT);
    assert!(d.generation() > before);
    assert_eq!(env.sub.devices(ClientScope::Namespace(ns1)).len(), 2);
    assert_traffic(&env);
    env.drv.del_netns(&env.ns1).unwrap();
    assert_eq!(env.drv.link_netns(&env.a), Some(NamespaceId::INIT));
    assert_traffic(&env);
    env.sub.shutdown();
}
