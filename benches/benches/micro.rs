//! Criterion micro-benchmarks of the soft provider's hot paths.
//!
//! - `wire/*`: BTH and whole-packet parse/emit (`provider/src/soft/wire`);
//! - `icrc/*`: the invariant CRC, reported per KiB;
//! - `verbs/post_poll_*`: `post_send` + `poll_cq` per work request on an
//!   in-process device pair (the whole soft path: engine lock, requester,
//!   inproc link, responder, ACK, completer, CQ);
//! - `core/mr_lookup_*`: a 1-byte RDMA write through the sans-IO `Core` API
//!   alone (two engines pumped by hand, no locks or links), with 1 and
//!   65,536 registered MRs on the responder, so the difference is the key
//!   lookup;
//! - `verbs/cq_poll_batch_*`: draining 32 completions with batches of 1 and
//!   16.
//!
//! Run: `cargo bench -p softverbs-benches` (add `-- --quick` for a fast
//! pass).

// criterion_group!/criterion_main! generate undocumented functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softverbs::soft::proto::{Core, CoreConfig, CqId, Datagram, QpCreate};
use softverbs::soft::wire::*;
use softverbs::verbs::*;
use softverbs_emulator::cli::perftest::args::{Params, PerfArgs};
use softverbs_emulator::cli::perftest::resources::{Dest, Side};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn params(args: &[&str]) -> Params {
    let mut v = vec!["perf"];
    v.extend_from_slice(args);
    Params::from_args(&Cli::parse_from(v).perf, BackendKind::Soft).expect("params")
}

fn write_packet(payload: &[u8]) -> (Vec<u8>, IpPseudoHeader, UdpPorts) {
    let mut h = PacketRepr::new(BthRepr::new(Opcode::RcRdmaWriteOnly, Qpn::new(0x11), Psn::new(42)));
    h.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: payload.len() as u32,
    });
    let ip = IpPseudoHeader::V4 {
        src: Ipv4Addr::new(127, 83, 86, 1),
        dst: Ipv4Addr::new(127, 83, 86, 2),
        id: 0,
        dont_fragment: true,
    };
    let ports = UdpPorts {
        src: 49152,
        dst: ROCEV2_UDP_PORT,
    };
    let mut buf = vec![0u8; payload.len() + 128];
    let len = h.emit(payload, &mut buf).expect("emit");
    buf.truncate(len);
    fill_icrc(&ip, ports, &mut buf).expect("icrc");
    (buf, ip, ports)
}

fn wire(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    let bth = BthRepr::new(Opcode::RcRdmaWriteOnly, Qpn::new(0x11), Psn::new(42));
    let mut buf = [0u8; BthRepr::LEN];
    g.bench_function("bth_emit", |b| b.iter(|| black_box(&bth).emit(black_box(&mut buf))));
    bth.emit(&mut buf).expect("emit");
    g.bench_function("bth_parse", |b| b.iter(|| BthRepr::parse(black_box(&buf))));
    let payload = [0x5au8; 64];
    let (pkt, _, _) = write_packet(&payload);
    let mut h = PacketRepr::new(bth);
    h.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x1234,
        dma_len: 64,
    });
    let mut out = vec![0u8; 256];
    g.bench_function("packet_emit_write_64B", |b| {
        b.iter(|| black_box(&h).emit(black_box(&payload), black_box(&mut out)))
    });
    g.bench_function("packet_parse_write_64B", |b| {
        b.iter(|| Packet::parse(black_box(&pkt)).is_ok())
    });
    g.finish();
}

fn icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for kib in [1usize, 4] {
        let payload = vec![0xa5u8; kib * 1024];
        let (pkt, ip, ports) = write_packet(&payload);
        g.throughput(Throughput::Bytes((kib * 1024) as u64));
        g.bench_with_input(BenchmarkId::new("compute", format!("{kib}KiB")), &pkt, |b, pkt| {
            b.iter(|| compute_icrc(&ip, ports, black_box(&pkt[..pkt.len() - ICRC_LEN])))
        });
        g.bench_with_input(BenchmarkId::new("check", format!("{kib}KiB")), &pkt, |b, pkt| {
            b.iter(|| check_icrc(&ip, ports, black_box(pkt)))
        });
    }
    g.finish();
}

struct Pair {
    a: Side,
    _b: Side,
    db: Vec<Dest>,
}

fn pair(p: &Params) -> Pair {
    let devs = softverbs::soft::embedded_default().expect("embedded default");
    let ca = devs[0].open().expect("open");
    let cb = devs[1].open().expect("open");
    let mut a = Side::new(&ca, p, p.max_size(), 1).expect("side");
    let mut b = Side::new(&cb, p, p.max_size(), 2).expect("side");
    let (da, db) = (a.dests(), b.dests());
    a.connect(&db).expect("connect");
    b.connect(&da).expect("connect");
    Pair { a, _b: b, db }
}

fn wait(cq: &Cq, wc: &mut [WorkCompletion]) -> usize {
    loop {
        let n = cq.poll(wc).expect("poll");
        if n > 0 {
            assert!(wc[..n].iter().all(WorkCompletion::is_success), "{:?}", &wc[..n]);
            return n;
        }
    }
}

fn verbs_path(c: &mut Criterion) {
    let p = params(&["write_bw", "-s", "8", "-t", "128", "-Q", "1", "-I", "64"]);
    let pr = pair(&p);
    let (a, db) = (&pr.a, &pr.db);
    let sge = [a.send_sge(0, 8).expect("sge")];
    let remote = db[0].remote();
    let mut g = c.benchmark_group("verbs");
    let mut wc = [WorkCompletion::default(); 16];
    for (name, flags) in [
        ("post_poll_write_8B", SendFlags::SIGNALED),
        ("post_poll_write_8B_inline", SendFlags::SIGNALED | SendFlags::INLINE),
    ] {
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                let wr = SendWr::new(0, SendOp::Write { remote }, &sge).flags(flags);
                a.qps[0].post_send(&[wr]).expect("post");
                wait(&a.scq, &mut wc)
            })
        });
    }
    // 16 WRs per post list, the last signaled: the per-WR cost with CQ
    // moderation.
    g.throughput(Throughput::Elements(16));
    g.bench_function("post_poll_write_8B_list16", |b| {
        b.iter(|| {
            let wrs: Vec<SendWr<'_>> = (0..16)
                .map(|k| {
                    let f = if k == 15 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    };
                    SendWr::new(0, SendOp::Write { remote }, &sge).flags(f)
                })
                .collect();
            a.qps[0].post_send(&wrs).expect("post");
            wait(&a.scq, &mut wc)
        })
    });
    // Poll 32 completions in batches of 1 and 16 (posting is not timed).
    for batch in [1usize, 16] {
        g.throughput(Throughput::Elements(32));
        g.bench_function(BenchmarkId::new("cq_poll_batch", batch), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let wrs: Vec<SendWr<'_>> = (0..32)
                        .map(|_| SendWr::new(0, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED))
                        .collect();
                    a.qps[0].post_send(&wrs).expect("post");
                    let t = Instant::now();
                    let mut got = 0;
                    while got < 32 {
                        got += wait(&a.scq, &mut wc[..batch]);
                    }
                    total += t.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

/// Two `Core`s connected by hand, for the sans-IO path.
struct CorePair {
    a: Core,
    b: Core,
    qpn_a: u32,
    cq_a: CqId,
    lkey: u32,
    laddr: u64,
    _local: Arc<MemorySource>,
    targets: Vec<(u64, u32)>,
    _remote: Vec<Arc<MemorySource>>,
    epoch: Instant,
}

fn core_pair(mrs: usize) -> CorePair {
    let devs = softverbs::soft::embedded_default().expect("embedded default");
    let (attr, port) = (devs[0].attr(), devs[0].port_attr());
    let ga = Gid::from_ip(std::net::IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1)));
    let gb = Gid::from_ip(std::net::IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)));
    let mut a = Core::new(CoreConfig::new(attr.clone(), port.clone(), vec![ga], 1));
    let mut b = Core::new(CoreConfig::new(attr, port, vec![gb], 2));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let make = |c: &mut Core| {
        let pd = c.alloc_pd(1).expect("pd");
        let (cq, _) = c.create_cq(1024, 0, 1).expect("cq");
        let (qpn, _) = c
            .create_qp(&QpCreate {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 256,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
                owner: 1,
            })
            .expect("qp");
        (pd, cq, qpn)
    };
    let (pd_a, cq_a, qpn_a) = make(&mut a);
    let (pd_b, _cq_b, qpn_b) = make(&mut b);
    let connect = |c: &mut Core, qpn: u32, dest: u32, dgid: Gid, psn: u32, rpsn: u32| {
        let init = QpModify::new()
            .with_state(QpState::Init)
            .with_pkey_index(0)
            .with_port_num(1);
        let rtr = QpModify::new().with_state(QpState::Rtr).with_path_mtu(Mtu::Mtu4096);
        let rtr = rtr
            .with_dest_qp_num(dest)
            .with_rq_psn(rpsn)
            .with_ah_attr(AhAttr::roce(dgid, 0, 1));
        let rts = QpModify::new()
            .with_state(QpState::Rts)
            .with_sq_psn(psn)
            .with_timeout(14);
        for m in [
            init.with_access_flags(AccessFlags::REMOTE_WRITE),
            rtr.with_max_dest_rd_atomic(16).with_min_rnr_timer(12),
            rts.with_retry_cnt(7).with_rnr_retry(7).with_max_rd_atomic(16),
        ] {
            c.modify_qp(0, qpn, &m.attr, m.mask).expect("modify_qp");
        }
    };
    connect(&mut a, qpn_a, qpn_b, gb, 100, 200);
    connect(&mut b, qpn_b, qpn_a, ga, 200, 100);
    let local = Arc::new(MemorySource::Owned(MrMemory::new(4096).expect("mem")));
    let (lkey, _) = a.reg_mr(pd_a, local.clone(), access).expect("reg");
    let mut remote = Vec::new();
    let mut targets = Vec::new();
    for _ in 0..mrs {
        let m = Arc::new(MemorySource::Owned(MrMemory::new(64).expect("mem")));
        let (_, rkey) = b.reg_mr(pd_b, m.clone(), access).expect("reg");
        targets.push((m.addr(), rkey));
        remote.push(m);
    }
    CorePair {
        a,
        b,
        qpn_a,
        cq_a,
        lkey,
        laddr: local.addr(),
        _local: local,
        targets,
        _remote: remote,
        epoch: Instant::now(),
    }
}

impl CorePair {
    /// One signaled 1-byte write to the MR `target`, pumped to completion.
    fn write(&mut self, target: usize, wc: &mut [WorkCompletion]) -> usize {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let (addr, rkey) = self.targets[target];
        // SAFETY: `laddr` is the start of the 4 KiB buffer registered under
        // `lkey`, kept alive by `_local` for as long as the pair exists.
        let sge = [unsafe { Sge::from_raw(self.laddr, 1, self.lkey) }];
        let wr = SendWr::new(
            7,
            SendOp::Write {
                remote: RemoteAddr { addr, rkey },
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        self.a.post_send(now, self.qpn_a, &[wr]).expect("post");
        loop {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                self.b.handle_datagram(now, dgram(&t));
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                self.a.handle_datagram(now, dgram(&t));
            }
            if !moved {
                break;
            }
        }
        let n = self.a.poll_cq(self.cq_a, wc).expect("poll");
        assert_eq!(n, 1);
        assert!(wc[0].is_success(), "{:?}", wc[0]);
        n
    }
}

fn dgram(t: &softverbs::soft::proto::Transmit) -> Datagram<'_> {
    Datagram {
        src: t.src,
        dst: t.dst,
        src_port: t.src_port,
        dst_port: t.dst_port,
        data: &t.data,
        train: None,
    }
}

fn core_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("core");
    let mut wc = [WorkCompletion::default(); 4];
    for mrs in [1usize, 65_536] {
        let mut cp = core_pair(mrs);
        let last = mrs - 1;
        g.bench_function(BenchmarkId::new("mr_lookup_write_1B", format!("{mrs}MRs")), |b| {
            b.iter(|| cp.write(black_box(last), &mut wc))
        });
        if mrs > 1 {
            // Spread over every key: a lookup that misses the cache.
            let mut k = 0usize;
            g.bench_function(
                BenchmarkId::new("mr_lookup_write_1B_spread", format!("{mrs}MRs")),
                |b| {
                    b.iter(|| {
                        k = (k + 7919) % mrs;
                        cp.write(k, &mut wc)
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group! {
    name = micro;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = wire, icrc, verbs_path, core_path
}
criterion_main!(micro);
