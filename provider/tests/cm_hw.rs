//! The connection manager on hardware devices (feature `hardware`): ids on
//! librdmacm, over whichever libibverbs and librdmacm are on the library
//! path (a NIC's rdma-core, or softverbs' own libraries).
//!
//! Connects two ids across two hardware devices of the subsystem (or, with
//! one device, to itself through it), sends data over the connected QPs,
//! disconnects, and checks every event: kind, namespace, device,
//! generation, listener, private data. Prints `SKIP: ...` when libibverbs
//! lists no RDMA device.
//!
//! The addresses are the devices' IPv4 GIDs, or `SOFTVERBS_CM_HW_ADDRS`
//! (`server_ip[,client_ip]`) when set. With `SOFTVERBS_CM_HW_PEER_ADDR`,
//! a child process whose (softverbs library) device has that address
//! serves [`hw_two_processes`]. A librdmacm without `rdma_init_qp_attr`
//! (which moves the ids' QPs) makes the tests that need a connected QP
//! print `SKIP: ...` after the steps before it passed.
#![cfg(feature = "hardware")]

mod cm_common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cm_common::{fd_count, thread_count, thread_count_settled};
use softverbs::cm::*;
use softverbs::subsystem::{HwFactory, NamespaceId, Subsystem, SubsystemConfig};
use softverbs::verbs::{
    AccessFlags, Cq, Pd, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .get_event(WAIT)
        .expect("get_event")
        .unwrap_or_else(|| panic!("no event, expected {kind:?}"));
    assert_eq!(ev.kind, kind, "event {ev:?}");
    ev
}

fn poll_one(cq: &Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default()];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Res {
    pd: Pd,
    cq: Cq,
}

/// A PD, a CQ and the id's QP; `Err` with the failure of `create_qp`.
fn try_qp(id: &CmId) -> Result<Res> {
    let ctx = id.verbs().expect("verbs");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, 0, None, 0).expect("cq");
    id.create_qp(
        &pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )?;
    Ok(Res { pd, cq })
}

fn with_qp(id: &CmId) -> Res {
    try_qp(id).expect("create_qp")
}

/// The first IPv4 address in a device's GID table.
fn ipv4_of(sub: &Subsystem, name: &str) -> Option<IpAddr> {
    let ctx = sub.open(name, "cm_hw-test").ok()?;
    let port = ctx.query_port(1).ok()?;
    (0..port.gid_tbl_len.min(64)).find_map(|i| {
        let g = ctx.query_gid(1, i).ok()?;
        let ip = g.to_ip();
        (ip.is_ipv4() && !ip.is_unspecified()).then_some(ip)
    })
}

/// The subsystem with up to two hardware devices, their names and the
/// server's and client's addresses; `None` (after a SKIP line) without
/// devices.
fn setup(test: &str) -> Option<(Arc<Subsystem>, Vec<String>, IpAddr, IpAddr)> {
    let devs = match softverbs::hw::provider().devices() {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => {
            println!("SKIP {test}: no RDMA device listed");
            return None;
        }
        Err(e) => {
            println!("SKIP {test}: no RDMA device listed ({e})");
            return None;
        }
    };
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let mut names = Vec::new();
    for d in devs.iter().take(2) {
        let name = d.name().to_string();
        sub.add_device(HwFactory::new(&sub, &name), NamespaceId::INIT)
            .expect("add hardware device");
        names.push(name);
    }
    let env: Vec<IpAddr> = std::env::var("SOFTVERBS_CM_HW_ADDRS")
        .ok()
        .map(|v| v.split(',').filter_map(|a| a.trim().parse().ok()).collect())
        .unwrap_or_default();
    let server = env
        .first()
        .copied()
        .or_else(|| ipv4_of(&sub, &names[0]))
        .expect("an IPv4 address on the first device (or SOFTVERBS_CM_HW_ADDRS)");
    let client = env
        .get(1)
        .copied()
        .or_else(|| names.get(1).and_then(|n| ipv4_of(&sub, n)))
        .unwrap_or(server);
    println!(
        "{test}: devices {names:?}, server {server}, client {client}{}",
        if client == server {
            " (one device: loopback)"
        } else {
            ""
        }
    );
    Some((sub, names, server, client))
}

#[test]
fn hw_connect_send_disconnect() {
    let Some((sub, names, server_ip, client_ip)) = setup("hw_connect_send_disconnect") else {
        return;
    };
    let cm = Cm::new(sub.clone(), CmConfig::default()).expect("cm");
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, PortSpace::Tcp, 77).unwrap();
    l.bind_addr(SocketAddr::new(server_ip, 0))
        .expect("bind on the hardware device");
    let port = l.local_addr().expect("bound").port();
    assert_ne!(port, 0, "librdmacm picks a port");
    l.listen(4).expect("listen");
    assert_eq!(l.state(), "LISTEN");
    let dst = SocketAddr::new(server_ip, port);

    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 5).unwrap();
    c.resolve_addr(Some(client_ip), dst).expect("resolve_addr");
    let ev = expect(&ch, CmEventKind::AddrResolved);
    assert_eq!(ev.namespace, NamespaceId::INIT);
    assert_eq!(ev.context, 5);
    let cdev = ev.device.clone().expect("the event names the device");
    assert!(names.contains(&cdev), "{cdev} is one of {names:?}");
    assert_eq!(
        ev.generation,
        Some(sub.device(&cdev).unwrap().generation()),
        "the device's generation"
    );
    assert_eq!(c.device().map(|d| d.0), Some(cdev.clone()));
    c.resolve_route().expect("resolve_route");
    expect(&ch, CmEventKind::RouteResolved);
    assert_eq!(c.state(), "ROUTE_RESOLVED");

    let cres = match try_qp(&c) {
        Ok(r) => r,
        // rdma-core's librdmacm always has it; a stand-in library may not.
        Err(Error::Unsupported("rdma_init_qp_attr")) => {
            println!("SKIP hw_connect_send_disconnect (after resolve_addr/resolve_route passed): the librdmacm on the library path does not implement rdma_init_qp_attr, which moves the id's QP");
            return;
        }
        Err(e) => panic!("create_qp: {e}"),
    };
    assert_eq!(c.qp().unwrap().query().unwrap().qp_state, QpState::Init);
    c.connect(&ConnParam {
        private_data: b"hello hw server".to_vec(),
        ..ConnParam::default()
    })
    .expect("connect");

    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..15], b"hello hw server");
    assert_eq!(req.listener, Some(l.id()));
    assert_eq!(req.context, 77);
    assert_eq!(req.namespace, NamespaceId::INIT);
    let sdev = req.device.clone().expect("the request names the device");
    assert!(names.contains(&sdev));
    assert_eq!(req.generation, Some(sub.device(&sdev).unwrap().generation()));
    assert_eq!(req.conn.as_ref().unwrap().qp_num, c.qp().unwrap().qp_num());
    let s = req.take_id().expect("the new id");
    assert_eq!(s.state(), "REQ_RCVD");
    let sres = with_qp(&s);
    let smr = sres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp()
        .unwrap()
        .post_recv(&[RecvWr::new(1, &[smr.sge(0, 64).unwrap()])])
        .unwrap();
    s.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        ..ConnParam::default()
    })
    .expect("accept");
    assert_eq!(s.qp().unwrap().query().unwrap().qp_state, QpState::Rts);

    let est = expect(&ch, CmEventKind::Established);
    assert_eq!(&est.private_data[..7], b"welcome");
    assert_eq!(est.device.as_deref(), Some(cdev.as_str()));
    assert_eq!(c.qp().unwrap().query().unwrap().qp_state, QpState::Rts);
    let sest = expect(&sch, CmEventKind::Established);
    assert_eq!(sest.listener, Some(l.id()));
    assert_eq!(c.state(), "ESTABLISHED");
    assert_eq!(s.state(), "ESTABLISHED");

    // The QPs really are connected: a SEND crosses.
    let cmr = cres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"over librdmacm").unwrap();
    c.qp()
        .unwrap()
        .post_send(&[SendWr::new(2, SendOp::Send, &[cmr.sge(0, 14).unwrap()]).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll_one(&cres.cq).status, WcStatus::Success);
    let wc = poll_one(&sres.cq);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(smr.to_vec(0, 14).unwrap(), b"over librdmacm");

    c.disconnect().expect("disconnect");
    assert_eq!(c.qp().unwrap().query().unwrap().qp_state, QpState::Err);
    let d = expect(&ch, CmEventKind::Disconnected);
    assert_eq!(d.device.as_deref(), Some(cdev.as_str()));
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(s.qp().unwrap().query().unwrap().qp_state, QpState::Err);
    drop((c, s, l, cres, sres));
    drop(cm);
}

/// Needs no QP: the client names one it drives itself (rdma_cm's
/// `qp_num`), the server rejects before creating any.
#[test]
fn hw_reject_carries_private_data() {
    let Some((sub, _names, server_ip, client_ip)) = setup("hw_reject_carries_private_data") else {
        return;
    };
    let cm = Cm::new(sub, CmConfig::default()).expect("cm");
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, PortSpace::Tcp, 0).unwrap();
    l.bind_addr(SocketAddr::new(server_ip, 0)).unwrap();
    l.listen(4).unwrap();
    let dst = SocketAddr::new(server_ip, l.local_addr().unwrap().port());
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    c.resolve_addr(Some(client_ip), dst).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    c.connect(&ConnParam {
        qp_num: 0x1234,
        private_data: b"let me in".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    assert_eq!(c.state(), "REQ_SENT");
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..9], b"let me in");
    assert_eq!(req.conn.as_ref().unwrap().qp_num, 0x1234);
    assert_eq!(req.listener, Some(l.id()));
    assert!(req.device.is_some() && req.generation.is_some());
    let s = req.take_id().unwrap();
    assert_eq!(s.state(), "REQ_RCVD");
    assert!(
        matches!(s.accept(&ConnParam::default()), Err(Error::InvalidState { .. })),
        "no QP to accept with"
    );
    assert!(matches!(
        s.reject(&[0; 149]),
        Err(Error::PrivateDataTooLong { len: 149, max: 148 })
    ));
    s.reject(b"go away").expect("reject");
    let rej = expect(&ch, CmEventKind::Rejected);
    assert_eq!(&rej.private_data[..7], b"go away");
    assert_eq!(c.state(), "DONE");
    assert_eq!(s.state(), "DONE");
    // A request whose event is dropped untaken is rejected (as on soft
    // devices).
    let c2 = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    c2.resolve_addr(Some(client_ip), dst).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c2.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    c2.connect(&ConnParam {
        qp_num: 0x1235,
        ..ConnParam::default()
    })
    .unwrap();
    drop(expect(&sch, CmEventKind::ConnectRequest));
    let rej = expect(&ch, CmEventKind::Rejected);
    assert_eq!(rej.id, c2.id());
    drop((c, c2, s, l));
    assert_eq!(cm.id_count(), 0, "hardware ids do not linger: {:?}", cm.id_states());
}

/// Whether the librdmacm on the path can move an id's QP (see
/// [`hw_connect_send_disconnect`]): a QP on an id resolved to `dst`.
fn qp_moves(cm: &Cm, client_ip: IpAddr, dst: SocketAddr) -> bool {
    let ch = EventChannel::new().unwrap();
    let id = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    id.resolve_addr(Some(client_ip), dst).expect("resolve_addr");
    expect(&ch, CmEventKind::AddrResolved);
    id.resolve_route().expect("resolve_route");
    expect(&ch, CmEventKind::RouteResolved);
    match try_qp(&id) {
        Ok(_) => true,
        Err(Error::Unsupported("rdma_init_qp_attr")) => false,
        Err(e) => panic!("create_qp: {e}"),
    }
}

/// The sockets-like API over hardware ids: a wildcard listener (soft and
/// librdmacm), connect, a SEND, close; the server sees one
/// `Disconnected` after its other receive is flushed.
#[test]
fn hw_listener_and_connection() {
    let Some((sub, _names, server_ip, client_ip)) = setup("hw_listener_and_connection") else {
        return;
    };
    let cm = Cm::new(sub, CmConfig::default()).expect("cm");
    let l = Listener::bind(&cm, NamespaceId::INIT, "0.0.0.0:0".parse().unwrap(), 4).expect("wildcard listener");
    let dst = SocketAddr::new(server_ip, l.local_addr().unwrap().port());
    if !qp_moves(&cm, client_ip, dst) {
        println!("SKIP hw_listener_and_connection (after the wildcard listen on librdmacm passed): the librdmacm on the library path does not implement rdma_init_qp_attr");
        return;
    }
    let t = std::thread::spawn(move || l.accept(&ConnOptions::default(), WAIT).unwrap().expect("a connection"));
    let c = Connection::connect(
        &cm,
        NamespaceId::INIT,
        Some(client_ip),
        dst,
        &ConnOptions::default(),
        WAIT,
    )
    .expect("connect");
    let s = t.join().unwrap();
    assert!(s.device().is_some() && c.device().is_some());
    let spd = s.pd().unwrap();
    let smr = spd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.post_recv(&[RecvWr::new(10, &[smr.sge(0, 64).unwrap()])]).unwrap();
    s.post_recv(&[RecvWr::new(11, &[smr.sge(0, 64).unwrap()])]).unwrap();
    let cpd = c.pd().unwrap();
    let cmr = cpd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"sock").unwrap();
    c.post_send(&[SendWr::new(1, SendOp::Send, &[cmr.sge(0, 4).unwrap()])])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    while seen == 0 {
        seen = s.poll(&mut wc).unwrap();
        let _ = c.poll(&mut [WorkCompletion::default(); 4]);
        assert!(Instant::now() < deadline, "no receive");
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (10, WcStatus::Success));
    assert_eq!(smr.to_vec(0, 4).unwrap(), b"sock");
    drop((cmr, cpd));
    c.close();
    let mut got = Vec::new();
    let end = loop {
        match s.poll(&mut wc) {
            Ok(n) => got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status))),
            Err(e) => break e,
        }
        assert!(Instant::now() < deadline + Duration::from_secs(30), "no end: {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(got, vec![(11, WcStatus::WrFlushErr)]);
    assert_eq!(end, ConnectionError::Disconnected);
}

/// One CM's life on librdmacm: a listener, a request, a reject, and
/// everything dropped.
fn request_reject_cycle(sub: &Arc<Subsystem>, server_ip: IpAddr, client_ip: IpAddr, ps: PortSpace) {
    let cm = Cm::new(sub.clone(), CmConfig::default()).expect("cm");
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, ps, 0).unwrap();
    l.bind_addr(SocketAddr::new(server_ip, 0)).unwrap();
    l.listen(4).unwrap();
    let dst = SocketAddr::new(server_ip, l.local_addr().unwrap().port());
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, ps, 0).unwrap();
    c.resolve_addr(Some(client_ip), dst).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    c.connect(&ConnParam {
        qp_num: 0x77,
        private_data: b"ud?".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..3], b"ud?");
    if ps == PortSpace::Udp {
        assert!(req.ud.is_some() && req.conn.is_none(), "{req:?}");
    }
    let s = req.take_id().unwrap();
    assert_eq!(
        s.state(),
        if ps == PortSpace::Udp {
            "SIDR_REQ_RCVD"
        } else {
            "REQ_RCVD"
        }
    );
    s.reject(b"no").unwrap();
    // A SIDR reply that refuses is UNREACHABLE (rdma_cm); a REJ is
    // REJECTED.
    let want = if ps == PortSpace::Udp {
        CmEventKind::Unreachable
    } else {
        CmEventKind::Rejected
    };
    let ev = expect(&ch, want);
    assert_ne!(ev.status, 0, "{ev:?}");
    drop((c, s, l));
    assert_eq!(cm.id_count(), 0);
}

/// UD ids (SIDR): the request reaches the listener with its UD
/// parameters; a reject reaches the client.
#[test]
fn hw_udp_request_and_reject() {
    let Some((sub, _names, server_ip, client_ip)) = setup("hw_udp_request_and_reject") else {
        return;
    };
    request_reject_cycle(&sub, server_ip, client_ip, PortSpace::Udp);
}

/// Many CMs come and go on librdmacm: no descriptor or thread is left
/// behind (each CM's event channel and thread end with it).
#[test]
fn hw_cycles_leak_nothing() {
    let Some((sub, _names, server_ip, client_ip)) = setup("hw_cycles_leak_nothing") else {
        return;
    };
    // Warm-up: the libraries' own lazily made descriptors and threads.
    request_reject_cycle(&sub, server_ip, client_ip, PortSpace::Tcp);
    let (fds, threads) = (fd_count(), thread_count());
    for _ in 0..20 {
        request_reject_cycle(&sub, server_ip, client_ip, PortSpace::Tcp);
    }
    assert_eq!(fd_count(), fds, "descriptors left behind");
    assert_eq!(thread_count_settled(threads), threads, "threads left behind");
}

/// The server half of [`hw_two_processes`], run in a child process (whose
/// library device has the second address); does nothing otherwise.
#[test]
fn hw_peer_server() {
    let Ok(addr) = std::env::var("SOFTVERBS_CM_HW_PEER_SERVER") else {
        return;
    };
    let addr: SocketAddr = addr.parse().expect("server address");
    let devs = softverbs::hw::provider().devices().expect("the child's device");
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let name = devs[0].name().to_string();
    sub.add_device(HwFactory::new(&sub, &name), NamespaceId::INIT).unwrap();
    let cm = Cm::new(sub.clone(), CmConfig::default()).unwrap();
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, PortSpace::Tcp, 9).unwrap();
    l.bind_addr(addr).expect("bind in the child");
    l.listen(4).unwrap();
    println!("LISTENING");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.device.as_deref(), Some(name.as_str()));
    assert_eq!(req.generation, Some(sub.device(&name).unwrap().generation()));
    assert_eq!(req.listener, Some(l.id()));
    let s = req.take_id().unwrap();
    s.reject(b"from the other device").unwrap();
    println!("REJECTED");
}

/// Two library devices in two processes (softverbs' libibverbs has one
/// device per process): a child of this test binary, its library device
/// at `SOFTVERBS_CM_HW_PEER_ADDR`, listens there; this process connects
/// from its own device; the child's reject with private data comes back
/// across. Runs only with `SOFTVERBS_CM_HW_PEER_ADDR` set.
#[test]
fn hw_two_processes() {
    let peer: Option<IpAddr> = std::env::var("SOFTVERBS_CM_HW_PEER_ADDR")
        .ok()
        .and_then(|a| a.trim().parse().ok());
    let Some(peer) = peer.filter(|_| std::env::var_os("SOFTVERBS_CM_HW_PEER_SERVER").is_none()) else {
        println!("SKIP hw_two_processes: no SOFTVERBS_CM_HW_PEER_ADDR for a second library device");
        return;
    };
    let Some((sub, _names, client_ip, _)) = setup("hw_two_processes") else {
        return;
    };
    let server = SocketAddr::new(peer, 7471);
    // The child's library device takes the second address.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hw_peer_server", "--nocapture", "--test-threads=1"])
        .env("SOFTVERBS_CM_HW_PEER_SERVER", server.to_string())
        .env("SOFTVERBS_ADDR", peer.to_string())
        .env_remove("SOFTVERBS_CM_HW_ADDRS")
        .env_remove("SOFTVERBS_CM_HW_PEER_ADDR")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the child");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        use std::io::BufRead;
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before listening: {:?}", child.wait());
        // libtest prints the test's name on the same line.
        if line.trim_end().ends_with("LISTENING") {
            break;
        }
    }
    let cm = Cm::new(sub, CmConfig::default()).unwrap();
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    c.resolve_addr(Some(client_ip), server).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    c.connect(&ConnParam {
        qp_num: 0x99,
        private_data: b"hello".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let rej = expect(&ch, CmEventKind::Rejected);
    assert_eq!(&rej.private_data[..21], b"from the other device");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success() && rest.contains("REJECTED"),
        "child: {status:?} {rest}"
    );
}
