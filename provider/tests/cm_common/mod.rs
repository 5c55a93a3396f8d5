//! Helpers of the connection manager's tests: a subsystem with in-process
//! soft devices, ids with QPs, and event waits with generous timeouts.
#![allow(dead_code, unreachable_pub)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softverbs::cm::*;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::Link;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::{Cq, Pd, QpCap, QpInitAttr, QpType};

pub const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// A name no other test of this process uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}_{}",
        std::process::id() % 10000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A config for tests: short timeouts, few retries, short time-wait.
pub fn fast_config() -> CmConfig {
    CmConfig {
        response_timeout: 15, // ~134 ms
        max_retries: 4,
        timewait: Duration::from_millis(50),
        ..CmConfig::default()
    }
}

pub struct World {
    pub sub: Arc<Subsystem>,
    pub fabric: Arc<dyn Link>,
    pub cm: Cm,
    pub names: Vec<String>,
}

/// A subsystem with in-process devices at 10.`net`.0.1, .2, … and a CM.
pub fn world(net: u8, devices: usize, cfg: CmConfig) -> World {
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let fabric: Arc<dyn Link> = InprocFabric::new();
    let mut names = Vec::new();
    for i in 0..devices {
        names.push(add_device(&sub, &fabric, net, i as u8 + 1, NamespaceId::INIT));
    }
    let cm = Cm::new(sub.clone(), cfg).expect("cm");
    World { sub, fabric, cm, names }
}

pub fn add_device(sub: &Subsystem, fabric: &Arc<dyn Link>, net: u8, host: u8, ns: NamespaceId) -> String {
    let name = unique("cm");
    let cfg = SoftDeviceConfig {
        link: Some(fabric.clone()),
        ..SoftDeviceConfig::new(&name, ip(net, host))
    };
    sub.add_device(SoftFactory::new(cfg), ns).expect("add device");
    name
}

pub fn ip(net: u8, host: u8) -> IpAddr {
    format!("10.{net}.0.{host}").parse().unwrap()
}

pub fn sa(net: u8, host: u8, port: u16) -> SocketAddr {
    SocketAddr::new(ip(net, host), port)
}

/// Waits for the next event and checks its kind.
pub fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .get_event(WAIT)
        .expect("get_event")
        .unwrap_or_else(|| panic!("no event, expected {kind:?}"));
    assert_eq!(ev.kind, kind, "event {ev:?}");
    ev
}

/// Verbs objects an id's QP lives on.
pub struct Res {
    pub pd: Pd,
    pub cq: Cq,
}

/// Creates a PD, a CQ and the id's QP.
pub fn with_qp(id: &CmId) -> Res {
    let ctx = id.verbs().expect("verbs");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, 0, None, 0).expect("cq");
    let qp_type = match id.port_space() {
        PortSpace::Tcp => QpType::Rc,
        PortSpace::Udp => QpType::Ud,
    };
    id.create_qp(
        &pd,
        &QpInitAttr {
            qp_type,
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
    )
    .expect("create_qp");
    Res { pd, cq }
}

/// A client id resolved (address and route) from `src` to `dst`.
pub fn resolved(cm: &Cm, ch: &EventChannel, ps: PortSpace, src: IpAddr, dst: SocketAddr) -> CmId {
    let id = cm.create_id(ch, ps, 7).expect("create_id");
    id.resolve_addr(Some(src), dst).expect("resolve_addr");
    expect(ch, CmEventKind::AddrResolved);
    id.resolve_route().expect("resolve_route");
    expect(ch, CmEventKind::RouteResolved);
    id
}

/// Connects a client on device 0 (10.`net`.0.1) to a listener on `port`
/// of device 1 whose events come on `sch`, both with QPs, and waits until
/// both sides are established; returns (client, client res, server id,
/// server res).
pub fn connected(w: &World, net: u8, port: u16, sch: &EventChannel, ch: &EventChannel) -> (CmId, Res, CmId, Res) {
    let c = resolved(&w.cm, ch, PortSpace::Tcp, ip(net, 1), sa(net, 2, port));
    let cres = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    let sres = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(ch, CmEventKind::Established);
    expect(sch, CmEventKind::Established);
    (c, cres, s, sres)
}

/// A listener on `addr`.
pub fn listener(cm: &Cm, ch: &EventChannel, ps: PortSpace, addr: SocketAddr) -> CmId {
    let l = cm.create_id(ch, ps, 99).expect("create_id");
    l.bind_addr(addr).expect("bind");
    l.listen(16).expect("listen");
    l
}

/// Open descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Threads of this process once the count is `want`, or after 10 s.
/// A joined thread can still be listed for a moment after its join
/// returned: the kernel wakes the joiner before it unlists the task.
pub fn thread_count_settled(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = thread_count();
        if n == want || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
