//! The connection manager on real network namespaces: ids connected over a
//! veth pair inside a namespace, then the namespace deleted from outside
//! (`ip netns del`, as an administrator would): every id there (the
//! wildcard listener, the passive and the active side) gets exactly one
//! DEVICE_REMOVAL, the deletion completes while the application still
//! holds them, and destroying them afterwards succeeds. And `ip addr del`
//! of the address a connection runs through gives its id one ADDR_CHANGE
//! at the driver's next `sync`.
//!
//! Needs root and `ip` (iproute2); prints one `skipping:` line otherwise.

#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::cm::*;
use softverbs::subsystem::{Subsystem, SubsystemConfig};
use softverbs::verbs::{Cq, Pd, QpCap, QpInitAttr, QpType};
use softverbs_emulator::netns::{LinuxNetns, NetnsDriver};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn ip(args: &[&str]) -> std::result::Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Removes the test's namespace and interfaces on every path.
struct Cleanup {
    netns: String,
    links: [String; 2],
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = ip(&["link", "del", l]);
        }
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch.get_event(WAIT).unwrap().unwrap_or_else(|| panic!("no {kind:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// Whether this host lets the test drive linux `what` (root, ip netns,
/// iproute2); prints the skip line if not.
fn can_run(what: &str) -> bool {
    if let Err(why) = LinuxNetns::check_privileges() {
        println!("skipping: the CM on linux {what} needs root and ip netns ({why})");
        return false;
    }
    if let Err(why) = ip(&["-V"]) {
        println!("skipping: the CM on linux {what} needs iproute2 ({why})");
        return false;
    }
    true
}

/// A PD, a CQ and the id's RC QP.
fn with_qp(id: &CmId) -> (Pd, Cq) {
    let ctx = id.verbs().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, 0, None, 0).unwrap();
    id.create_qp(
        &pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )
    .unwrap();
    (pd, cq)
}

#[test]
fn ip_netns_del_removes_every_id_there_once_without_waiting_for_them() {
    if !can_run("namespaces") {
        return;
    }
    let pid = std::process::id() % 100_000;
    let (a, b, ns) = (format!("svcm{pid}a"), format!("svcm{pid}b"), format!("svcm{pid}"));
    let cleanup = Cleanup {
        netns: ns.clone(),
        links: [a.clone(), b.clone()],
    };
    let third = (std::process::id() % 250) as u8 + 1;
    let (addr_a, addr_b) = (IpAddr::from([10, 216, third, 1]), IpAddr::from([10, 216, third, 2]));

    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(500),
        ..SubsystemConfig::default()
    }));
    let drv = LinuxNetns::new(sub.clone()).expect("driver");
    drv.add_veth(&a, addr_a, &b, addr_b).unwrap();
    drv.add_device(&format!("cmlnx{pid}a"), &a).unwrap();
    drv.add_device(&format!("cmlnx{pid}b"), &b).unwrap();
    let nsid = drv.add_netns(&ns).unwrap();
    drv.link_set_netns(&a, &ns).unwrap();
    drv.link_set_netns(&b, &ns).unwrap();
    let cm = Cm::new(
        sub.clone(),
        CmConfig {
            timewait: Duration::from_millis(50),
            ..CmConfig::default()
        },
    )
    .unwrap();

    // A wildcard listener in the namespace, and a connection to it.
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id_in(nsid, &sch, PortSpace::Tcp, 1).unwrap();
    l.bind_addr("0.0.0.0:6100".parse().unwrap()).unwrap();
    l.listen(4).unwrap();
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id_in(nsid, &ch, PortSpace::Tcp, 2).unwrap();
    c.resolve_addr(Some(addr_a), SocketAddr::new(addr_b, 6100)).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    let c_objs = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(req.namespace, nsid);
    let s = req.take_id().unwrap();
    let s_objs = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);

    // Deleted from outside, while every id and its objects are held.
    ip(&["netns", "del", &ns]).unwrap();
    let start = Instant::now();
    loop {
        drv.sync().unwrap();
        if sub.namespace_ref(nsid).is_err() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the namespace was never deleted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!std::path::Path::new("/run/netns").join(&ns).exists());

    // One removal per id, each saying where it came from; nothing more.
    let mut server_side = Vec::new();
    while let Some(ev) = sch.get_event(Some(Duration::from_secs(2))).unwrap() {
        assert_eq!(ev.kind, CmEventKind::DeviceRemoval, "{ev:?}");
        assert_eq!(ev.namespace, nsid);
        server_side.push(ev.id);
    }
    server_side.sort();
    let mut want = vec![l.id(), s.id()];
    want.sort();
    assert_eq!(server_side, want);
    let ev = expect(&ch, CmEventKind::DeviceRemoval);
    assert_eq!((ev.id, ev.namespace), (c.id(), nsid));
    assert!(ch.get_event(Some(Duration::from_millis(200))).unwrap().is_none());

    // Destroying afterwards succeeds; the devices are gone.
    drop((c_objs, s_objs));
    c.destroy();
    s.destroy();
    l.destroy();
    assert!(sub.device(&format!("cmlnx{pid}a")).is_err());
    drop(cm);
    drop(drv);
    drop(cleanup);
}

#[test]
fn ip_addr_del_gives_the_ids_bound_through_it_one_addr_change() {
    if !can_run("interfaces") {
        return;
    }
    let pid = std::process::id() % 100_000;
    let (a, b) = (format!("svad{pid}a"), format!("svad{pid}b"));
    let cleanup = Cleanup {
        netns: format!("svad{pid}"),
        links: [a.clone(), b.clone()],
    };
    let third = (std::process::id() % 250) as u8 + 1;
    let (addr_a, addr_b) = (IpAddr::from([10, 217, third, 1]), IpAddr::from([10, 217, third, 2]));
    // A second address on a, in another subnet (deleting a primary
    // address takes its subnet's secondaries with it).
    let other = IpAddr::from([10, 218, third, 11]);

    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let drv = LinuxNetns::new(sub.clone()).expect("driver");
    drv.add_veth(&a, addr_a, &b, addr_b).unwrap();
    ip(&["addr", "add", &format!("{other}/24"), "dev", &a]).unwrap();
    let dev_a = format!("cmadr{pid}a");
    drv.add_device(&dev_a, &a).unwrap();
    drv.add_device(&format!("cmadr{pid}b"), &b).unwrap();
    let gen_a = sub.device(&dev_a).unwrap().generation();
    let cm = Cm::new(sub.clone(), CmConfig::default()).unwrap();

    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, PortSpace::Tcp, 1).unwrap();
    l.bind_addr(SocketAddr::new(addr_b, 6101)).unwrap();
    l.listen(4).unwrap();
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 2).unwrap();
    c.resolve_addr(Some(addr_a), SocketAddr::new(addr_b, 6101)).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    let c_objs = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    let s_objs = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);
    // Bound through a's other address: not concerned.
    let och = EventChannel::new().unwrap();
    let o = cm.create_id(&och, PortSpace::Tcp, 3).unwrap();
    o.bind_addr(SocketAddr::new(other, 0)).unwrap();
    assert_eq!(drv.sync().unwrap(), 0, "nothing changed yet");

    // Removed from outside: the next sync reports it, once.
    ip(&["addr", "del", &format!("{addr_a}/24"), "dev", &a]).unwrap();
    assert!(drv.sync().unwrap() >= 1);
    let ev = expect(&ch, CmEventKind::AddrChange);
    assert_eq!(ev.id, c.id());
    assert_eq!(ev.device.as_deref(), Some(dev_a.as_str()));
    assert_eq!(ev.generation, Some(gen_a));
    assert_eq!(drv.sync().unwrap(), 0);
    for chan in [&ch, &sch, &och] {
        assert!(chan.get_event(Some(Duration::from_millis(200))).unwrap().is_none());
    }
    // Through the driver: the other address goes, and its id hears it.
    drv.del_addr(&a, other).unwrap();
    let ev = expect(&och, CmEventKind::AddrChange);
    assert_eq!(ev.id, o.id());
    assert!(ch.get_event(Some(Duration::from_millis(200))).unwrap().is_none());

    drop((c_objs, s_objs));
    drop((c, s, o, l));
    drop(cm);
    drop(drv);
    drop(cleanup);
}
