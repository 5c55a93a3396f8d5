//! The ULP layer's cost per operation against raw post/poll, on the
//! embedded in-process soft device pair (inline progress, one thread):
//! one signaled RDMA WRITE posted and its completion polled, at 8 bytes
//! and at 64 KiB, raw (`Qp::post_send` + `Cq::poll`) and through the
//! layer (`UlpQp::post` with a callback + `UlpCq::poll`).
//!
//! Run: `cargo bench -p softverbs-benches --bench ulp` (add `-- --quick`
//! for a fast pass).
//!
//! Counting mode, for instruction counts on a loaded machine (wall clock
//! is noise there): with `ULP_COUNT=<arm>:<n>[:<bytes>]` in the
//! environment the binary sets the pair up, runs `n` operations of that
//! arm (8 bytes unless given, at most 64 KiB) and exits, without
//! criterion. Arms: `raw`; `ulp` (one `UlpWr` over one buffer, no `Vec`);
//! `ulpchain` (the WR in a `Vec`); `ulpvec` (the scatter list in a `Vec`
//! too). Run it under callgrind at two values of `n` and take the
//! inclusive cost of the arm's function (`Pair::raw`, `Pair::ulp`, ...):
//! the difference over the difference of the `n`s is one operation, setup
//! excluded.
//!
//! Ratio mode, for the wall clock on a shared machine: with
//! `ULP_RATIO=<blocks>:<ops>[:<bytes>]` the arms run in turn, `ops`
//! operations at a time, `blocks` times, and the binary prints each arm's
//! median time per operation and its median ratio to the raw arm within a
//! block (`ulplean` is the layer with a callback that keeps no reference
//! count: the layer's own cost; `ulpstatic` the same over a buffer of a
//! `'static` MR, [`LocalBuf::from_static`], which the request keeps no
//! count of either). Pin it to one CPU (`taskset -c 1`).
//!
//! ```text
//! cargo bench -p softverbs-benches --bench ulp --no-run   # prints the binary
//! ULP_COUNT=ulp:2000 valgrind --tool=callgrind --callgrind-out-file=cg.ulp.2000 <binary>
//! ULP_COUNT=ulp:12000 valgrind --tool=callgrind --callgrind-out-file=cg.ulp.12000 <binary>
//! callgrind_annotate --inclusive=yes cg.ulp.12000 | grep 'Pair::ulp '
//! ```

// criterion_group!/criterion_main! generate undocumented functions.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, Criterion, Throughput};
use softverbs::ulp::{Chain, LocalBuf, UlpCq, UlpQp, UlpQpInit, UlpWr};
use softverbs::verbs::*;

struct End {
    ctx: Context,
    pd: Pd,
    raw_cq: Cq,
    raw_qp: Qp,
    cq: UlpCq,
    qp: UlpQp,
}

fn end(ctx: Context) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let raw_cq = ctx.create_cq(256, 0, None, 0).unwrap();
    let raw_qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &raw_cq,
            recv_cq: &raw_cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let cq = UlpCq::new(&ctx, 256).unwrap();
    let init = UlpQpInit {
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        ..UlpQpInit::default()
    };
    let qp = UlpQp::create(&pd, &cq, &cq, &init).unwrap();
    End {
        ctx,
        pd,
        raw_cq,
        raw_qp,
        cq,
        qp,
    }
}

/// `qp` of `ctx` to RTS towards `peer` of `peer_ctx` (PSNs 0, MTU 4096, one
/// READ each way).
fn connect(ctx: &Context, qp: &Qp, peer_ctx: &Context, peer: &Qp) {
    let local = Endpoint::local(ctx, qp, 1, 0).unwrap().with_psn(0);
    let remote = Endpoint::local(peer_ctx, peer, 1, 0).unwrap().with_psn(0);
    let opts = Connect::new().mtu(Mtu::Mtu4096).min_rnr_timer(1);
    opts.max_rd_atomic(1)
        .max_dest_rd_atomic(1)
        .apply(ctx, qp, &local, Some(&remote))
        .unwrap();
}

/// Both ends connected twice (raw and through the layer), and the
/// buffers.
struct Pair {
    a: End,
    _b: End,
    src: Arc<Mr>,
    /// The same memory as `src` would be, in an MR never dropped.
    src_static: &'static Mr,
    dst: Mr,
    done: Arc<AtomicU64>,
    lean: &'static AtomicU64,
    wc: [WorkCompletion; 4],
}

impl Pair {
    fn new() -> Pair {
        let devs = softverbs::soft::embedded_default().unwrap();
        let a = end(devs[0].open().unwrap());
        let b = end(devs[1].open().unwrap());
        connect(&a.ctx, &a.raw_qp, &b.ctx, &b.raw_qp);
        connect(&b.ctx, &b.raw_qp, &a.ctx, &a.raw_qp);
        connect(&a.ctx, a.qp.qp(), &b.ctx, b.qp.qp());
        connect(&b.ctx, b.qp.qp(), &a.ctx, a.qp.qp());
        let src = Arc::new(a.pd.alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap());
        let src_static = Box::leak(Box::new(a.pd.alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap()));
        let dst =
            b.pd.alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap();
        Pair {
            a,
            _b: b,
            src,
            src_static,
            dst,
            done: Arc::new(AtomicU64::new(0)),
            lean: Box::leak(Box::new(AtomicU64::new(0))),
            wc: [WorkCompletion::default(); 4],
        }
    }

    /// One signaled WRITE of `len` bytes posted and polled, raw verbs.
    #[inline(never)]
    fn raw(&mut self, len: u32) {
        let sge = [self.src.sge(0, len).unwrap()];
        let wr = SendWr::new(
            1,
            SendOp::Write {
                remote: self.dst.remote(0),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        self.a.raw_qp.post_send(&[wr]).unwrap();
        loop {
            let n = self.a.raw_cq.poll(&mut self.wc).unwrap();
            if n > 0 {
                assert!(self.wc[0].is_success());
                break;
            }
        }
    }

    /// The same through the layer: one WR over one buffer, both kept
    /// inline by the layer (no `Vec`), posted with a callback (stored
    /// inline), polled until the callback ran.
    #[inline(never)]
    fn ulp(&mut self, len: u32) {
        let wr = UlpWr::write(LocalBuf::new(&self.src, 0, len).unwrap(), self.dst.remote(0));
        self.post_and_poll(wr);
    }

    /// As [`Pair::ulp`], with the chain given as a `Vec` of one WR (one
    /// allocation).
    #[inline(never)]
    fn ulp_chain(&mut self, len: u32) {
        let wr = UlpWr::write(LocalBuf::new(&self.src, 0, len).unwrap(), self.dst.remote(0));
        self.post_and_poll(vec![wr]);
    }

    /// As [`Pair::ulp_chain`], with the scatter list given as a `Vec` too
    /// (two allocations).
    #[inline(never)]
    fn ulp_vec(&mut self, len: u32) {
        let wr = UlpWr::write(vec![LocalBuf::new(&self.src, 0, len).unwrap()], self.dst.remote(0));
        self.post_and_poll(vec![wr]);
    }

    /// As [`Pair::ulp`], with a callback that keeps no reference count:
    /// it captures a `&'static` counter and bumps it with a load and a
    /// store (the poll runs on this thread), so the figure is the layer's
    /// own cost with nothing of the closure's.
    #[inline(never)]
    fn ulp_lean(&mut self, len: u32) {
        let buf = LocalBuf::new(&self.src, 0, len).unwrap();
        self.post_and_poll_lean(buf);
    }

    /// As [`Pair::ulp_lean`], over a buffer of an MR that lives for the
    /// rest of the process ([`LocalBuf::from_static`]): no reference count
    /// of the MR per request either.
    #[inline(never)]
    fn ulp_static(&mut self, len: u32) {
        let buf = LocalBuf::from_static(self.src_static, 0, len).unwrap();
        self.post_and_poll_lean(buf);
    }

    /// A WRITE of `buf` posted with the lean callback, polled until it ran.
    #[inline(always)]
    fn post_and_poll_lean(&mut self, buf: LocalBuf) {
        let wr = UlpWr::write(buf, self.dst.remote(0));
        let d: &'static AtomicU64 = self.lean;
        let want = d.load(Ordering::Relaxed) + 1;
        self.a
            .qp
            .post(wr, move |wc| {
                assert!(wc.is_success());
                d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            })
            .unwrap();
        while d.load(Ordering::Relaxed) < want {
            self.a.cq.poll(16).unwrap();
        }
    }

    #[inline(always)]
    fn post_and_poll(&mut self, chain: impl Into<Chain>) {
        let want = self.done.load(Ordering::Relaxed) + 1;
        let d = self.done.clone();
        self.a
            .qp
            .post(chain, move |wc| {
                assert!(wc.is_success());
                d.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        while self.done.load(Ordering::Relaxed) < want {
            self.a.cq.poll(16).unwrap();
        }
    }
}

fn ulp(c: &mut Criterion) {
    let mut p = Pair::new();
    let mut g = c.benchmark_group("ulp");
    for len in [8u32, 64 << 10] {
        g.throughput(Throughput::Elements(1));
        let name = if len == 8 { "8B" } else { "64KiB" };
        g.bench_function(format!("raw_write_{name}"), |bch| bch.iter(|| p.raw(len)));
        g.bench_function(format!("ulp_write_{name}"), |bch| bch.iter(|| p.ulp(len)));
        g.bench_function(format!("ulplean_write_{name}"), |bch| bch.iter(|| p.ulp_lean(len)));
        g.bench_function(format!("ulpstatic_write_{name}"), |bch| bch.iter(|| p.ulp_static(len)));
    }
    g.finish();
}

criterion_group!(benches, ulp);

/// The ratio mode (`ULP_RATIO=<blocks>:<ops>[:<bytes>]`): the arms run in
/// turn, `ops` operations each, `blocks` times; prints each arm's median
/// time per operation and the median over blocks of its ratio to the raw
/// arm's time in the same block. Alternating in small blocks cancels the
/// drift of a shared machine that separate criterion runs see.
fn ratio(spec: &str) {
    let usage = "ULP_RATIO=<blocks>:<ops>[:<bytes>]";
    let mut it = spec.split(':');
    let blocks: usize = it.next().and_then(|n| n.parse().ok()).expect(usage);
    let ops: u32 = it.next().and_then(|n| n.parse().ok()).expect(usage);
    let len: u32 = it.next().map_or(8, |l| l.parse().expect(usage));
    assert!(blocks > 0 && ops > 0 && len <= 64 << 10, "{usage}");
    type Arm = fn(&mut Pair, u32);
    let arms: [(&str, Arm); 4] = [
        ("raw", Pair::raw),
        ("ulp", Pair::ulp),
        ("ulplean", Pair::ulp_lean),
        ("ulpstatic", Pair::ulp_static),
    ];
    let mut p = Pair::new();
    let mut times = vec![Vec::with_capacity(blocks); arms.len()];
    for (_, arm) in &arms {
        for _ in 0..ops {
            arm(&mut p, len);
        }
    }
    for _ in 0..blocks {
        for (k, (_, arm)) in arms.iter().enumerate() {
            let t = std::time::Instant::now();
            for _ in 0..ops {
                arm(&mut p, len);
            }
            times[k].push(t.elapsed().as_nanos() as f64 / f64::from(ops));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (k, (name, _)) in arms.iter().enumerate() {
        let ratios = times[k].iter().zip(&times[0]).map(|(a, r)| a / r).collect();
        println!(
            "{name:8} {len:6} B  {:8.1} ns/op  ratio to raw {:.3}",
            median(times[k].clone()),
            median(ratios)
        );
    }
}

fn main() {
    if let Ok(spec) = std::env::var("ULP_RATIO") {
        return ratio(&spec);
    }
    if let Ok(spec) = std::env::var("ULP_COUNT") {
        let mut it = spec.split(':');
        let usage = "ULP_COUNT=<raw|ulp|ulpchain|ulpvec|ulplean|ulpstatic>:<n>[:<bytes>]";
        let arm = it.next().expect(usage);
        let n: u64 = it.next().and_then(|n| n.parse().ok()).expect(usage);
        let len: u32 = it.next().map_or(8, |l| l.parse().expect(usage));
        assert!(len <= 64 << 10, "{usage}: at most 64 KiB");
        let mut p = Pair::new();
        for _ in 0..n {
            match arm {
                "raw" => p.raw(len),
                "ulp" => p.ulp(len),
                "ulpchain" => p.ulp_chain(len),
                "ulpvec" => p.ulp_vec(len),
                "ulplean" => p.ulp_lean(len),
                "ulpstatic" => p.ulp_static(len),
                _ => panic!("{usage}"),
            }
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
