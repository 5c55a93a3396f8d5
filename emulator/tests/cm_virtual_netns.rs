//! The connection manager over the virtual namespace driver: connections
//! inside a namespace, listeners in two namespaces served by one handler
//! that tells them apart by the event's namespace, an id whose device's
//! interface moves away gets DEVICE_REMOVAL once, and deleting a namespace
//! removes each id there once without waiting for the application, and
//! an address removed from (or moved off) an interface gives each id bound
//! through it one ADDR_CHANGE.

use std::sync::Arc;
use std::time::Duration;

use softverbs::cm::*;
use softverbs::subsystem::{NamespaceId, Subsystem, SubsystemConfig};
use softverbs_emulator::netns::{NetnsDriver, VirtualNetns};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch.get_event(WAIT).unwrap().unwrap_or_else(|| panic!("no {kind:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

fn config() -> CmConfig {
    CmConfig {
        response_timeout: 15,
        max_retries: 3,
        timewait: Duration::from_millis(50),
        ..CmConfig::default()
    }
}

/// Resolves, creates a QP and connects from `src` to `dst` in `ns`.
fn connect(cm: &Cm, ns: NamespaceId, ch: &EventChannel, src: &str, dst: &str) -> (CmId, Vec<Box<dyn std::any::Any>>) {
    let id = cm.create_id_in(ns, ch, PortSpace::Tcp, 0).unwrap();
    id.resolve_addr(Some(src.parse().unwrap()), dst.parse().unwrap())
        .unwrap();
    expect(ch, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    expect(ch, CmEventKind::RouteResolved);
    let keep = qp(&id);
    id.connect(&ConnParam::default()).unwrap();
    (id, keep)
}

fn qp(id: &CmId) -> Vec<Box<dyn std::any::Any>> {
    let ctx = id.verbs().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, 0, None, 0).unwrap();
    id.create_qp(
        &pd,
        &softverbs::verbs::QpInitAttr {
            qp_type: softverbs::verbs::QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: softverbs::verbs::QpCap {
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
    vec![Box::new(cq), Box::new(pd)]
}

#[test]
fn one_handler_serves_listeners_in_two_namespaces() {
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }));
    let drv = VirtualNetns::new(sub.clone());
    let blue = drv.add_netns("cm_blue").unwrap();
    let red = drv.add_netns("cm_red").unwrap();
    // Each namespace an isolated network (the driver wants addresses
    // unique across namespaces).
    for (ns, tag, net) in [("cm_blue", "b", 66), ("cm_red", "r", 67)] {
        for host in 1..=2 {
            let ifname = format!("{tag}eth{host}");
            drv.add_link(&ifname, format!("10.{net}.0.{host}").parse().unwrap())
                .unwrap();
            drv.add_device(&format!("cm_v{tag}{host}"), &ifname).unwrap();
            drv.link_set_netns(&ifname, ns).unwrap();
        }
    }
    let cm = Cm::new(sub.clone(), config()).unwrap();
    // One channel for both listeners: the handler tells them apart.
    let sch = EventChannel::new().unwrap();
    let lb = cm.create_id_in(blue, &sch, PortSpace::Tcp, 1).unwrap();
    lb.bind_addr("0.0.0.0:5555".parse().unwrap()).unwrap();
    lb.listen(4).unwrap();
    let lr = cm.create_id_in(red, &sch, PortSpace::Tcp, 2).unwrap();
    lr.bind_addr("0.0.0.0:5555".parse().unwrap()).unwrap();
    lr.listen(4).unwrap();
    let mut keep = Vec::new();
    for (ns, listener, dev, net) in [(blue, &lb, "cm_vb2", 66), (red, &lr, "cm_vr2", 67)] {
        let ch = EventChannel::new().unwrap();
        let (c, k) = connect(&cm, ns, &ch, &format!("10.{net}.0.1"), &format!("10.{net}.0.2:5555"));
        let mut req = expect(&sch, CmEventKind::ConnectRequest);
        assert_eq!(req.namespace, ns);
        assert_eq!(req.listener, Some(listener.id()));
        assert_eq!(req.device.as_deref(), Some(dev));
        assert_eq!(req.generation, Some(sub.device(dev).unwrap().generation()));
        let s = req.take_id().unwrap();
        let ks = qp(&s);
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, CmEventKind::Established);
        let est = expect(&sch, CmEventKind::Established);
        assert_eq!(est.namespace, ns);
        keep.push((c, k, s, ks, ch));
    }

    // The blue server's interface moves to red: its id (bound to the old
    // generation) gets DEVICE_REMOVAL once; the blue listener, bound to no
    // device, sees nothing.
    let s_blue = keep[0].2.id();
    drv.link_set_netns("beth2", "cm_red").unwrap();
    let ev = expect(&sch, CmEventKind::DeviceRemoval);
    assert_eq!((ev.id, ev.namespace), (s_blue, blue));
    assert!(sch.get_event(Some(Duration::from_millis(200))).unwrap().is_none());

    // Deleting red: every id there gets one removal, the deletion does not
    // wait for them (they are all still alive here).
    let red_ids = [lr.id(), keep[1].2.id()];
    drv.del_netns("cm_red").unwrap();
    let mut got = Vec::new();
    while let Some(ev) = sch.get_event(Some(Duration::from_secs(1))).unwrap() {
        assert_eq!(ev.kind, CmEventKind::DeviceRemoval, "{ev:?}");
        assert_eq!(ev.namespace, red);
        got.push(ev.id);
    }
    got.sort();
    let mut want = red_ids.to_vec();
    want.sort();
    assert_eq!(got, want);
    // The red client's channel: its own removal.
    let ev = expect(&keep[1].4, CmEventKind::DeviceRemoval);
    assert_eq!(ev.namespace, red);
    drop(keep);
    drop((lb, lr));
}

/// Nothing more on `ch` for a while.
fn quiet(ch: &EventChannel) {
    if let Some(ev) = ch.get_event(Some(Duration::from_millis(200))).unwrap() {
        panic!("unexpected {ev:?}");
    }
}

#[test]
fn removed_or_moved_address_gives_its_ids_one_addr_change() {
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let drv = VirtualNetns::new(sub.clone());
    let ns = drv.add_netns("cm_addr").unwrap();
    // aeth has two addresses (its device two GIDs), beth one.
    drv.add_link("aeth", "10.68.0.1".parse().unwrap()).unwrap();
    drv.add_addr("aeth", "10.68.0.11".parse().unwrap()).unwrap();
    drv.add_link("beth", "10.68.0.2".parse().unwrap()).unwrap();
    for (dev, ifname) in [("cm_addr_a", "aeth"), ("cm_addr_b", "beth")] {
        drv.add_device(dev, ifname).unwrap();
        drv.link_set_netns(ifname, "cm_addr").unwrap();
    }
    let gen_a = sub.device("cm_addr_a").unwrap().generation();
    let cm = Cm::new(sub.clone(), config()).unwrap();

    let sch = EventChannel::new().unwrap();
    let l = cm.create_id_in(ns, &sch, PortSpace::Tcp, 0).unwrap();
    l.bind_addr("10.68.0.2:6000".parse().unwrap()).unwrap();
    l.listen(4).unwrap();
    let wch = EventChannel::new().unwrap();
    let wild = cm.create_id_in(ns, &wch, PortSpace::Tcp, 0).unwrap();
    wild.bind_addr("0.0.0.0:6001".parse().unwrap()).unwrap();
    wild.listen(4).unwrap();

    // Connected through 10.68.0.1.
    let ch = EventChannel::new().unwrap();
    let (c, _kc) = connect(&cm, ns, &ch, "10.68.0.1", "10.68.0.2:6000");
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    let _ks = qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);
    // Bound through the device's other address, and resolved through it.
    let och = EventChannel::new().unwrap();
    let bound = cm.create_id_in(ns, &och, PortSpace::Tcp, 0).unwrap();
    bound.bind_addr("10.68.0.11:0".parse().unwrap()).unwrap();
    let resolved = cm.create_id_in(ns, &och, PortSpace::Udp, 0).unwrap();
    resolved
        .resolve_addr(Some("10.68.0.11".parse().unwrap()), "10.68.0.2:6000".parse().unwrap())
        .unwrap();
    expect(&och, CmEventKind::AddrResolved);

    // 10.68.0.1 goes away: the connected id hears it once, with its
    // namespace, device and generation; the ids on the other address, the
    // passive side, the listeners: nothing.
    drv.del_addr("aeth", "10.68.0.1".parse().unwrap()).unwrap();
    let ev = expect(&ch, CmEventKind::AddrChange);
    assert_eq!(ev.id, c.id());
    assert_eq!(ev.namespace, ns);
    assert_eq!(ev.device.as_deref(), Some("cm_addr_a"));
    assert_eq!(ev.generation, Some(gen_a));
    assert_eq!(c.state(), "ESTABLISHED", "the id keeps its state");
    // Reported again (a driver that polls): nothing new.
    sub.address_change(
        "cm_addr_a",
        "10.68.0.1".parse().unwrap(),
        softverbs::subsystem::AddressChange::Removed,
    )
    .unwrap();
    assert!(drv.del_addr("aeth", "10.68.0.1".parse().unwrap()).is_err());
    for chan in [&ch, &sch, &wch, &och] {
        quiet(chan);
    }
    // The CM no longer binds through it.
    let late = cm.create_id_in(ns, &och, PortSpace::Tcp, 0).unwrap();
    assert_eq!(
        late.bind_addr("10.68.0.1:0".parse().unwrap()),
        Err(Error::NoDevice("10.68.0.1".parse().unwrap()))
    );

    // 10.68.0.11 moves to beth (a failover): both ids bound through it on
    // cm_addr_a hear it once; nobody else does.
    drv.add_addr("beth", "10.68.0.11".parse().unwrap()).unwrap();
    let mut got = [
        expect(&och, CmEventKind::AddrChange),
        expect(&och, CmEventKind::AddrChange),
    ];
    got.sort_by_key(|e| e.id);
    assert_eq!([got[0].id, got[1].id], [bound.id(), resolved.id()]);
    assert!(got
        .iter()
        .all(|e| e.device.as_deref() == Some("cm_addr_a") && e.namespace == ns));
    for chan in [&ch, &sch, &wch, &och] {
        quiet(chan);
    }
    // An address given to aeth (no id bound through it: no event) is
    // used from its device's next instance; moving aeth makes one, which
    // has only that address.
    drv.add_addr("aeth", "10.68.0.21".parse().unwrap()).unwrap();
    drv.link_set_netns("aeth", "init").unwrap();
    expect(&ch, CmEventKind::DeviceRemoval);
    for _ in 0..2 {
        expect(&och, CmEventKind::DeviceRemoval);
    }
    let init = cm.create_id(&och, PortSpace::Tcp, 0).unwrap();
    assert!(init.bind_addr("10.68.0.1:0".parse().unwrap()).is_err());
    assert!(init.bind_addr("10.68.0.11:0".parse().unwrap()).is_err());
    init.bind_addr("10.68.0.21:0".parse().unwrap()).unwrap();
    for chan in [&sch, &wch, &och] {
        quiet(chan);
    }
}
