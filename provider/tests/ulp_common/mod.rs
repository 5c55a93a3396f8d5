//! Helpers of the ULP layer tests: fresh soft device pairs on the
//! in-process fabric and connected layer QPs.

#![allow(dead_code, unused_imports)] // each test file uses a part

mod callbacks;
pub(crate) use callbacks::*;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::ulp::{UlpCq, UlpQp, UlpQpInit};
use softverbs::verbs::*;

/// A fresh pair of soft devices (unique names and addresses per call).
pub(crate) fn devices(tag: &str) -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id() as u8;
    let mk = |k: u8| {
        let addr = IpAddr::V4(Ipv4Addr::new(
            127,
            100 + k * 20 + (n / 250) as u8,
            pid,
            (n % 250) as u8 + 1,
        ));
        SoftDevice::create(SoftDeviceConfig::new(&format!("ulp_{tag}_{n}_{k}"), addr)).expect("device")
    };
    (mk(0), mk(1))
}

/// One end: context, PD, CQ and a QP through the layer.
pub(crate) struct End {
    pub(crate) ctx: Context,
    pub(crate) pd: Pd,
    pub(crate) cq: UlpCq,
    pub(crate) qp: Option<UlpQp>,
    pub(crate) gid: Gid,
}

impl End {
    pub(crate) fn new(dev: &Arc<SoftDevice>, init: &UlpQpInit, cqe: u32) -> End {
        End::from_ctx(dev.open().unwrap(), init, cqe)
    }

    pub(crate) fn from_ctx(ctx: Context, init: &UlpQpInit, cqe: u32) -> End {
        let pd = ctx.alloc_pd().unwrap();
        let cq = UlpCq::new(&ctx, cqe).unwrap();
        let qp = UlpQp::create(&pd, &cq, &cq, init).unwrap();
        let gid = ctx.query_gid(1, 0).unwrap();
        End {
            ctx,
            pd,
            cq,
            qp: Some(qp),
            gid,
        }
    }

    pub(crate) fn qp(&self) -> &UlpQp {
        self.qp.as_ref().unwrap()
    }

    pub(crate) fn mr(&self, len: usize) -> Arc<Mr> {
        Arc::new(
            self.pd
                .alloc_mr(
                    len,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                )
                .unwrap(),
        )
    }
}

/// Moves `a`'s QP to RTS towards `b`'s, with `rd` READ credits each way.
/// Through the layer's own `modify` (it takes the READ depth from RTS), so
/// the steps are [`QpModify`]s rather than a [`Connect`].
pub(crate) fn connect_one(a: &End, b: &End, rd: u8, retry: u8) {
    let qp = a.qp();
    let steps = [
        QpModify::new()
            .with_state(QpState::Init)
            .with_pkey_index(0)
            .with_port_num(1)
            .with_access_flags(AccessFlags::REMOTE),
        QpModify::new()
            .with_state(QpState::Rtr)
            .with_path_mtu(Mtu::Mtu1024)
            .with_dest_qp_num(b.qp().qp_num())
            .with_rq_psn(0)
            .with_max_dest_rd_atomic(rd)
            .with_min_rnr_timer(1)
            .with_ah_attr(AhAttr::roce(b.gid, 0, 1)),
        QpModify::new()
            .with_state(QpState::Rts)
            .with_sq_psn(0)
            .with_timeout(14)
            .with_retry_cnt(retry)
            .with_rnr_retry(7)
            .with_max_rd_atomic(rd),
    ];
    for m in steps {
        qp.modify(&m.attr, m.mask).unwrap();
    }
}

/// Two ends on contexts `a` and `b` (CQs of 1,024 entries), connected to
/// each other with `rd` READ credits each way.
pub(crate) fn connected(a: Context, b: Context, init: &UlpQpInit, rd: u8) -> (End, End) {
    let a = End::from_ctx(a, init, 1024);
    let b = End::from_ctx(b, init, 1024);
    connect_one(&a, &b, rd, 7);
    connect_one(&b, &a, rd, 7);
    (a, b)
}

/// Two connected ends on a fresh device pair.
pub(crate) fn pair(tag: &str, init: &UlpQpInit, rd: u8) -> (Arc<SoftDevice>, Arc<SoftDevice>, End, End) {
    let (da, db) = devices(tag);
    let (a, b) = connected(da.open().unwrap(), db.open().unwrap(), init, rd);
    (da, db, a, b)
}

/// Polls both CQs until `done()` or the generous deadline; panics then.
pub(crate) fn poll_until(cqs: &[&UlpCq], what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !done() {
        for cq in cqs {
            cq.poll(64).unwrap();
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Fills `mr` with bytes derived from `seed`.
pub(crate) fn fill(mr: &Mr, seed: u8) {
    let v: Vec<u8> = (0..mr.length() as usize)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    mr.write(0, &v).unwrap();
}

/// Writes `locals` (page-sized MRs of `a`, filled from `seed` first) to
/// `remote` (of `b`) through one read/write context of `mode` (fast
/// registrations from `pool`), waits for its callback and checks that
/// every page landed. Returns what the context posted.
pub(crate) fn rw_write_pages(
    (a, b): (&End, &End),
    locals: &[Arc<Mr>],
    remote: &Mr,
    pool: Option<&softverbs::ulp::MrPool>,
    mode: softverbs::ulp::RegMode,
    seed: u8,
) -> softverbs::ulp::RwPosted {
    use softverbs::ulp::{LocalBuf, RwDir, RwOptions};
    for (k, m) in locals.iter().enumerate() {
        fill(m, seed.wrapping_add(k as u8));
    }
    let sgl: Vec<LocalBuf> = locals.iter().map(|m| LocalBuf::whole(m).unwrap()).collect();
    let (n, done) = counter();
    let opts = RwOptions {
        mode,
        ..RwOptions::default()
    };
    let posted = a
        .qp()
        .rw(RwDir::Write, sgl, remote.remote(0), pool, opts, done)
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the write context", || n.load(Ordering::SeqCst) == 1);
    for (k, m) in locals.iter().enumerate() {
        assert_eq!(
            remote.to_vec(k as u64 * 4096, 4096).unwrap(),
            m.to_vec(0, 4096).unwrap(),
            "{mode:?} page {k}"
        );
    }
    posted
}
