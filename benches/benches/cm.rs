//! What the connection manager's hotplug-safe [`Connection`] costs on the
//! post/poll fast path against a raw CM id's QP and CQ: one signaled
//! 8-byte RDMA WRITE posted and its completion polled, between two
//! in-process soft devices under one subsystem (inline progress, one
//! thread). Both arms run over the same devices and the same CM; the
//! raw arm posts on `CmId::qp()` and polls its own CQ, the other goes
//! through `Connection::post_send` and `Connection::poll`.
//!
//! Run: `cargo bench -p softverbs-benches --bench cm` (add `-- --quick`
//! for a fast pass).
//!
//! Counting mode, for instruction counts on a loaded machine (wall clock
//! is noise there): with `CM_COUNT=<raw|conn>:<n>` in the environment the
//! binary sets both connections up, runs `n` operations of that arm and
//! exits, without criterion. Run it under callgrind at two values of `n`:
//! the difference of the totals divided by the difference of the `n`s is
//! the instructions of one operation, setup excluded.
//!
//! ```text
//! cargo bench -p softverbs-benches --bench cm --no-run   # prints the binary
//! CM_COUNT=conn:20000 valgrind --tool=callgrind --callgrind-out-file=/dev/null <binary>
//! ```

// criterion_group!/criterion_main! generate undocumented functions.
#![allow(missing_docs)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use softverbs::cm::*;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::Link;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::*;

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn ip(host: u8) -> IpAddr {
    IpAddr::from([10, 93, 0, host])
}

fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let ev = ch.get_event(WAIT).unwrap().expect("a CM event");
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// A PD, a CQ and the id's RC QP.
fn with_qp(id: &CmId) -> (Pd, Cq) {
    let ctx = id.verbs().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(128, 0, None, 0).unwrap();
    id.create_qp(
        &pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
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

/// A raw id's end: the id, its QP (taken once), and its verbs objects.
struct RawEnd {
    _id: CmId,
    qp: Arc<Qp>,
    _pd: Pd,
    cq: Cq,
}

/// Both connections, raw and through [`Connection`], and their buffers.
struct Pair {
    _cm: Cm,
    raw: RawEnd,
    _raw_peer: RawEnd,
    _raw_ids: (CmId, EventChannel, EventChannel),
    raw_src: Mr,
    raw_dst: Mr,
    conn: Connection,
    _conn_peer: Connection,
    conn_src: Mr,
    conn_dst: Mr,
    wc: [WorkCompletion; 4],
}

impl Pair {
    fn new() -> Pair {
        let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
        let fabric: Arc<dyn Link> = InprocFabric::new();
        for host in [1, 2] {
            let cfg = SoftDeviceConfig {
                link: Some(fabric.clone()),
                ..SoftDeviceConfig::new(&format!("cmbench{}_{host}", std::process::id()), ip(host))
            };
            sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
        }
        let cm = Cm::new(sub, CmConfig::default()).unwrap();

        // Raw ids.
        let lch = EventChannel::new().unwrap();
        let l = cm.create_id(&lch, PortSpace::Tcp, 0).unwrap();
        l.bind_addr(SocketAddr::new(ip(2), 7100)).unwrap();
        l.listen(4).unwrap();
        let ch = EventChannel::new().unwrap();
        let c = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
        c.resolve_addr(Some(ip(1)), SocketAddr::new(ip(2), 7100)).unwrap();
        expect(&ch, CmEventKind::AddrResolved);
        c.resolve_route().unwrap();
        expect(&ch, CmEventKind::RouteResolved);
        let (cpd, ccq) = with_qp(&c);
        c.connect(&ConnParam::default()).unwrap();
        let mut req = expect(&lch, CmEventKind::ConnectRequest);
        let s = req.take_id().unwrap();
        let (spd, scq) = with_qp(&s);
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, CmEventKind::Established);
        expect(&lch, CmEventKind::Established);
        let raw_src = cpd.alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap();
        let raw_dst = spd
            .alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();

        // Connections.
        let listener = Listener::bind(&cm, NamespaceId::INIT, SocketAddr::new(ip(2), 7101), 4).unwrap();
        let t = std::thread::spawn(move || listener.accept(&ConnOptions::default(), WAIT));
        let conn = Connection::connect(
            &cm,
            NamespaceId::INIT,
            Some(ip(1)),
            SocketAddr::new(ip(2), 7101),
            &ConnOptions::default(),
            WAIT,
        )
        .unwrap();
        let peer = t.join().unwrap().unwrap().expect("a connection");
        let conn_src = conn.pd().unwrap().alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap();
        let conn_dst = peer
            .pd()
            .unwrap()
            .alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        Pair {
            _cm: cm,
            raw: RawEnd {
                qp: c.qp().expect("the id's QP"),
                _id: c,
                _pd: cpd,
                cq: ccq,
            },
            _raw_peer: RawEnd {
                qp: s.qp().expect("the id's QP"),
                _id: s,
                _pd: spd,
                cq: scq,
            },
            _raw_ids: (l, lch, ch),
            raw_src,
            raw_dst,
            conn,
            _conn_peer: peer,
            conn_src,
            conn_dst,
            wc: [WorkCompletion::default(); 4],
        }
    }

    /// One signaled WRITE of `len` bytes on the raw id's QP, polled on its
    /// CQ.
    #[inline(never)]
    fn raw(&mut self, len: u32) {
        let sge = [self.raw_src.sge(0, len).unwrap()];
        let wr = SendWr::new(
            1,
            SendOp::Write {
                remote: self.raw_dst.remote(0),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        self.raw.qp.post_send(&[wr]).unwrap();
        loop {
            let n = self.raw.cq.poll(&mut self.wc).unwrap();
            if n > 0 {
                assert!(self.wc[0].is_success());
                break;
            }
        }
    }

    /// The same through the connection.
    #[inline(never)]
    fn conn(&mut self, len: u32) {
        let sge = [self.conn_src.sge(0, len).unwrap()];
        let wr = SendWr::new(
            1,
            SendOp::Write {
                remote: self.conn_dst.remote(0),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        self.conn.post_send(&[wr]).unwrap();
        loop {
            let n = self.conn.poll(&mut self.wc).unwrap();
            if n > 0 {
                assert!(self.wc[0].is_success());
                break;
            }
        }
    }
}

fn cm(c: &mut Criterion) {
    let mut p = Pair::new();
    let mut g = c.benchmark_group("cm");
    for len in [8u32, 64 << 10] {
        g.throughput(Throughput::Elements(1));
        let name = if len == 8 { "8B" } else { "64KiB" };
        g.bench_function(format!("raw_id_write_{name}"), |b| b.iter(|| p.raw(len)));
        g.bench_function(format!("connection_write_{name}"), |b| b.iter(|| p.conn(len)));
    }
    g.finish();
}

criterion_group!(benches, cm);

fn main() {
    if let Ok(spec) = std::env::var("CM_COUNT") {
        let (arm, n) = spec.split_once(':').expect("CM_COUNT=<raw|conn>:<n>");
        let n: u64 = n.parse().expect("a count");
        let mut p = Pair::new();
        for _ in 0..n {
            match arm {
                "raw" => p.raw(8),
                "conn" => p.conn(8),
                _ => panic!("CM_COUNT arm is raw or conn"),
            }
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
