//! `cq.*`: completion queues: creation limits, resize, overflow, one-shot
//! and solicited notification, completion channels (docs/design.md §3.1, §3.4).

use std::time::{Duration, Instant};

use softverbs::verbs::*;

use crate::case::{Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail};

type R<T> = std::result::Result<T, Stop>;

pub(crate) fn register(out: &mut Vec<Case>) {
    out.push(Case::new(
        "cq.create.zero_cqe",
        "creating a CQ with 0 entries fails with EINVAL",
        "ibv_create_cq(3) (cqe must be at least 1)",
        &[],
        |env: &Env| {
            expect_err(
                env.a.create_cq(0, 0, None, 0),
                ErrorKind::InvalidArgument,
                "create_cq(0)",
            )
        },
    ));
    out.push(Case::new(
        "cq.create.above_max_cqe",
        "creating a CQ with max_cqe + 1 entries fails with EINVAL",
        "ibv_create_cq(3); ibv_query_device(3) max_cqe",
        &[],
        |env: &Env| {
            let max = env.caps.device.max_cqe;
            ensure!(max < u32::MAX, "max_cqe is u32::MAX; nothing is above it");
            expect_err(
                env.a.create_cq(max + 1, 0, None, 0),
                ErrorKind::InvalidArgument,
                "create_cq(max_cqe + 1)",
            )
        },
    ));
    out.push(Case::new(
        "cq.create.granted_at_least_requested",
        "a created CQ holds at least the requested number of entries and keeps its context",
        "ibv_create_cq(3) (the CQ has at least cqe entries)",
        &[],
        |env: &Env| {
            for n in [1u32, 7, 64, 1000] {
                let cq = env.a.create_cq(n, 0xc0ffee + u64::from(n), None, 0)?;
                ensure!(cq.capacity() >= n, "requested {n} entries, got {}", cq.capacity());
                ensure_eq!(cq.context(), 0xc0ffee + u64::from(n), "CQ context");
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.poll.empty",
        "polling an empty CQ returns 0",
        "ibv_poll_cq(3)",
        &[],
        |env: &Env| {
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let mut wc = [WorkCompletion::default(); 4];
            ensure_eq!(cq.poll(&mut wc)?, 0, "completions in an empty CQ");
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.poll.partial_batches",
        "10 queued completions polled 3 at a time come out at most 3 per call (the first call full), in order",
        "ibv_poll_cq(3) (returns at most num_entries; the rest stay queued)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            post_writes(&p, 0..10, true)?;
            settle_writes(&p, 10)?;
            let mut got = Vec::new();
            let mut sizes = Vec::new();
            let start = Instant::now();
            while got.len() < 10 && start.elapsed() < WAIT {
                let mut wc = [WorkCompletion::default(); 3];
                let n = p.a.scq.poll(&mut wc)?;
                if n > 0 {
                    sizes.push(n);
                    got.extend(wc[..n].iter().map(|w| w.wr_id));
                }
            }
            ensure_eq!(got, (0..10).collect::<Vec<u64>>(), "wr_ids polled");
            // All ten were queued before the first poll (settle), so the
            // first batch is full; no batch exceeds the array.
            ensure!(
                sizes.first() == Some(&3) && sizes.iter().all(|&n| n <= 3),
                "batch sizes {sizes:?}"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.destroy.busy_with_qp",
        "destroying a CQ used by a QP fails with EBUSY; after the QP is destroyed it succeeds",
        "docs/design.md §3.1; ibv_destroy_cq(3)",
        &[],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let qp = create_qp(&pd, QpType::Rc, &cq, &cq, None, super::device::small_cap())?;
            let cq = match cq.destroy() {
                Ok(()) => fail!("destroy_cq succeeded while a QP uses the CQ"),
                Err(e) if e.error.kind() == ErrorKind::Busy => e.object,
                Err(e) => fail!("expected EBUSY, got {}", e.error),
            };
            qp.destroy()?;
            cq.destroy()?;
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.resize.grow",
        "resizing a CQ to a larger size succeeds and the capacity is at least the new size",
        "ibv_resize_cq(3)",
        &[],
        |env: &Env| {
            let cq = env.a.create_cq(8, 0, None, 0)?;
            let n = cq.resize(100)?;
            ensure!(
                n >= 100 && cq.capacity() >= 100,
                "resized to 100, capacity {n} / {}",
                cq.capacity()
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.resize.keeps_completions",
        "completions queued before a resize are still delivered, in order, after it",
        "ibv_resize_cq(3)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            post_writes(&p, 0..4, true)?;
            settle_writes(&p, 4)?;
            p.a.scq.resize(64)?;
            let wcs = expect_n(&p.a.scq, 4, "completions after the resize")?;
            let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
            ensure_eq!(ids, vec![0, 1, 2, 3], "wr_ids after the resize");
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.resize.below_queued",
        "resizing a CQ below the number of queued completions fails with EINVAL and loses nothing",
        "ibv_resize_cq(3) (the new size must hold the queued completions)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            post_writes(&p, 0..6, true)?;
            settle_writes(&p, 6)?;
            expect_err(
                p.a.scq.resize(2),
                ErrorKind::InvalidArgument,
                "resize below the queued count",
            )?;
            let wcs = expect_n(&p.a.scq, 6, "completions after the failed resize")?;
            ensure_eq!(wcs.len(), 6, "completions kept");
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.overflow.async_cq_err",
        "generating more completions than a CQ holds raises the CQ_ERR async event for that CQ",
        "docs/design.md §3.4 (CQ overrun: async CQ_ERR); IBTA 11.6.2",
        &[],
        |env: &Env| {
            let (_p, cq, ctx_value) = overflow(env)?;
            let ev = wait_async(&env.a, WAIT, |e| e.event_type == EventType::CqErr)?;
            match ev {
                Some(e) => ensure_eq!(e.element, AsyncElement::Cq(ctx_value), "CQ_ERR element"),
                None => fail!(
                    "no CQ_ERR event within {WAIT:?} after overrunning a CQ of {}",
                    cq.capacity()
                ),
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.overflow.poll_fails",
        "after an overrun the CQ is unusable: ibv_poll_cq returns an error",
        "docs/design.md §3.4 (CQ overrun: CQ unusable)",
        &[],
        |env: &Env| {
            let (_p, cq, _) = overflow(env)?;
            let mut wc = [WorkCompletion::default(); 64];
            let start = Instant::now();
            loop {
                match cq.poll(&mut wc) {
                    Err(_) => return Ok(()),
                    Ok(_) if start.elapsed() > WAIT => {
                        fail!("poll_cq kept succeeding after the CQ overran")
                    }
                    Ok(_) => {}
                }
            }
        },
    ));
    out.push(Case::new(
        "cq.notify.next_is_one_shot",
        "req_notify_cq fires the channel once for the next completion; without re-arming no second event comes",
        "ibv_req_notify_cq(3); docs/design.md §3.4 (notify is one-shot)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let (p, cq) = pair_with_channel_cq(env, &ch, 0x51)?;
            cq.req_notify(false)?;
            post_writes(&p, 0..1, true)?;
            expect_event(&ch, 0x51, "event for the first completion")?;
            cq.ack_events(1);
            drain(&cq, 1)?;
            post_writes(&p, 1..2, true)?;
            drain(&cq, 1)?;
            expect_no_event(&ch, "a second event without re-arming")
        },
    ));
    out.push(Case::new(
        "cq.notify.unarmed_no_event",
        "a CQ that was never armed does not signal its channel",
        "ibv_req_notify_cq(3)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let (p, cq) = pair_with_channel_cq(env, &ch, 0x52)?;
            post_writes(&p, 0..2, true)?;
            drain(&cq, 2)?;
            expect_no_event(&ch, "an event from an unarmed CQ")
        },
    ));
    out.push(Case::new(
        "cq.notify.rearm_fires_again",
        "re-arming after an event makes the next completion fire again",
        "ibv_req_notify_cq(3), ibv_get_cq_event(3)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let (p, cq) = pair_with_channel_cq(env, &ch, 0x53)?;
            for round in 0..3u64 {
                cq.req_notify(false)?;
                post_writes(&p, round..round + 1, true)?;
                expect_event(&ch, 0x53, &format!("event of round {round}"))?;
                cq.ack_events(1);
                drain(&cq, 1)?;
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.notify.solicited_only",
        "a CQ armed for solicited events ignores an unsolicited receive and fires for a SOLICITED send",
        "ibv_req_notify_cq(3) (solicited_only); IBTA 11.4.2.2",
        &[],
        |env: &Env| {
            let ch = env.b.create_comp_channel()?;
            let rcq = env.b.create_cq(64, 0x54, Some(&ch), 0)?;
            let p = pair_with_recv_cq(env, &rcq)?;
            for i in 0..2 {
                p.b.post_recv(i, i * 256, 256)?;
            }
            rcq.req_notify(true)?;
            send_a(&p, 1, SendFlags::SIGNALED)?;
            expect_one(&rcq, "unsolicited receive")?;
            expect_no_event(&ch, "an event for an unsolicited receive")?;
            send_a(&p, 2, SendFlags::SIGNALED | SendFlags::SOLICITED)?;
            expect_event(&ch, 0x54, "event for a solicited receive")?;
            rcq.ack_events(1);
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.notify.solicited_fires_on_error",
        "a CQ armed for solicited events fires for an error completion (a flushed receive)",
        "docs/design.md §3.4 (solicited-only fires for any error); IBTA 11.4.2.2",
        &[],
        |env: &Env| {
            let ch = env.b.create_comp_channel()?;
            let rcq = env.b.create_cq(64, 0x55, Some(&ch), 0)?;
            let p = pair_with_recv_cq(env, &rcq)?;
            p.b.post_recv(9, 0, 256)?;
            rcq.req_notify(true)?;
            p.b.move_to(QpState::Err)?;
            let wc = expect_one(&rcq, "flushed receive")?;
            check_wc(&wc, 9, WcStatus::WrFlushErr, None, "flushed receive")?;
            expect_event(&ch, 0x55, "event for an error completion")?;
            rcq.ack_events(1);
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.channel.timeout",
        "get_cq_event with a timeout and nothing pending returns nothing after about that time",
        "ibv_get_cq_event(3) (with poll(2) on the channel fd)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let _cq = env.a.create_cq(8, 1, Some(&ch), 0)?;
            let start = Instant::now();
            let got = ch.get_cq_event(Some(Duration::from_millis(30)))?;
            let took = start.elapsed();
            ensure!(got.is_none(), "an event arrived with nothing armed: {got:?}");
            ensure!(
                took >= Duration::from_millis(25) && took < WAIT,
                "a 30 ms wait took {took:?}"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.channel.two_cqs",
        "two CQs on one channel: each event carries the context of the CQ that fired",
        "ibv_create_comp_channel(3), ibv_get_cq_event(3)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let (p1, cq1) = pair_with_channel_cq(env, &ch, 0x61)?;
            let (p2, cq2) = pair_with_channel_cq(env, &ch, 0x62)?;
            cq1.req_notify(false)?;
            cq2.req_notify(false)?;
            post_writes(&p2, 0..1, true)?;
            expect_event(&ch, 0x62, "event of the second CQ")?;
            post_writes(&p1, 0..1, true)?;
            expect_event(&ch, 0x61, "event of the first CQ")?;
            cq1.ack_events(1);
            cq2.ack_events(1);
            Ok(())
        },
    ));
    out.push(Case::new(
        "cq.channel.destroy_busy",
        "destroying a completion channel that a CQ still uses fails with EBUSY",
        "ibv_destroy_comp_channel(3)",
        &[],
        |env: &Env| {
            let ch = env.a.create_comp_channel()?;
            let cq = env.a.create_cq(8, 1, Some(&ch), 0)?;
            let ch = match ch.destroy() {
                Ok(()) => fail!("destroy_comp_channel succeeded while a CQ uses it"),
                Err(e) if e.error.kind() == ErrorKind::Busy => e.object,
                Err(e) => fail!("expected EBUSY, got {}", e.error),
            };
            cq.destroy()?;
            ch.destroy()?;
            Ok(())
        },
    ));
}

/// Posts one 64-byte write from A to B per id in `ids` (signaled or not).
pub(crate) fn post_writes(p: &Pair, ids: std::ops::Range<u64>, signaled: bool) -> Check {
    p.a.mr.fill(0, 64, WRITE_BYTE)?;
    let sge = [p.a.mr.sge(0, 64)?];
    let flags = if signaled {
        SendFlags::SIGNALED
    } else {
        SendFlags::empty()
    };
    for id in ids {
        let remote = p.b.mr.remote(64 * (id % 64));
        p.a.post(SendWr::new(id, SendOp::Write { remote }, &sge).flags(flags))?;
    }
    Ok(())
}

/// Waits until the bytes of the last of `n` WRITEs from [`post_writes`]
/// are at B, then gives the ACKs time to come back, so that the
/// completions are queued at A without consuming them (a CQ cannot be
/// peeked). A device that completes asynchronously (a NIC, or the emulator
/// library's progress thread on a loaded machine) may need more than a
/// fixed pause for the first part.
fn settle_writes(p: &Pair, n: u64) -> Check {
    let at = 64 * ((n - 1) % 64);
    let start = Instant::now();
    while p.b.mr.to_vec(at, 64)? != [WRITE_BYTE; 64] {
        if start.elapsed() > WAIT {
            fail!("the last of {n} WRITEs did not land within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(200));
    Ok(())
}

/// The byte [`post_writes`] writes.
const WRITE_BYTE: u8 = 0x5a;

/// Gives the device time to generate the completions of work already
/// posted without consuming them (a CQ cannot be peeked). The soft provider
/// completes inside `post_send`; a NIC on loopback needs microseconds.
fn settle() {
    std::thread::sleep(Duration::from_millis(20));
}

/// A pair whose side A sends on a CQ of four entries, overrun by five
/// signaled writes; returns the pair, the small CQ and its context.
fn overflow(env: &Env) -> R<(Pair, Cq, u64)> {
    let cfg = PairConfig::default();
    let small = env.a.create_cq(4, 0xcafe, None, 0)?;
    let cap = small.capacity();
    ensure!(
        cap < 4096,
        "the device granted {cap} entries for 4; cannot overrun it cheaply"
    );
    let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
    let qp = create_qp(
        &p.a.pd,
        QpType::Rc,
        &small,
        &p.a.rcq,
        None,
        QpCap {
            max_send_wr: cap + 8,
            ..cfg.cap
        },
    )?;
    connect_qps(&cfg, (&qp, p.a.gid_index, p.a.gid), (&p.b.qp, p.b.gid_index, p.b.gid))?;
    let sge = [p.a.mr.sge(0, 8)?];
    for id in 0..u64::from(cap) + 1 {
        let remote = p.b.mr.remote(8 * id);
        qp.post_send(&[SendWr::new(id, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED)])?;
    }
    settle();
    // Keep the QP alive with the pair: it replaces A's unused QP.
    let mut p = p;
    p.a.qp = qp;
    Ok((p, small, 0xcafe))
}

/// A connected pair whose A-side QP sends on a new CQ bound to `ch` with
/// context `context`; returns the pair and that CQ.
fn pair_with_channel_cq(env: &Env, ch: &CompChannel, context: u64) -> R<(Pair, Cq)> {
    let cfg = PairConfig::default();
    let cq = env.a.create_cq(64, context, Some(ch), 0)?;
    let mut p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
    let qp = create_qp(&p.a.pd, QpType::Rc, &cq, &p.a.rcq, None, cfg.cap)?;
    connect_qps(&cfg, (&qp, p.a.gid_index, p.a.gid), (&p.b.qp, p.b.gid_index, p.b.gid))?;
    p.a.qp = qp;
    Ok((p, cq))
}

/// A connected pair whose B-side QP receives on `rcq`.
fn pair_with_recv_cq(env: &Env, rcq: &Cq) -> R<Pair> {
    let cfg = PairConfig::default();
    let mut p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
    let qp = create_qp(&p.b.pd, QpType::Rc, &p.b.scq, rcq, None, cfg.cap)?;
    connect_qps(&cfg, (&p.a.qp, p.a.gid_index, p.a.gid), (&qp, p.b.gid_index, p.b.gid))?;
    p.b.qp = qp;
    Ok(p)
}

/// Sends 16 bytes from A with `flags` and waits for the send completion.
fn send_a(p: &Pair, wr_id: u64, flags: SendFlags) -> Check {
    let sge = [p.a.mr.sge(0, 16)?];
    p.a.post(SendWr::new(wr_id, SendOp::Send, &sge).flags(flags))?;
    let wc = expect_one(&p.a.scq, "send completion")?;
    check_wc(&wc, wr_id, WcStatus::Success, Some(WcOpcode::Send), "send")
}

fn drain(cq: &Cq, n: usize) -> Check {
    expect_n(cq, n, "completions")?;
    Ok(())
}

fn expect_event(ch: &CompChannel, context: u64, what: &str) -> Check {
    match ch.get_cq_event(Some(WAIT))? {
        Some(c) => {
            ensure_eq!(c, context, "{what}: CQ context");
            Ok(())
        }
        None => fail!("{what}: no event within {WAIT:?}"),
    }
}

fn expect_no_event(ch: &CompChannel, what: &str) -> Check {
    match ch.get_cq_event(Some(QUIET))? {
        None => Ok(()),
        Some(c) => fail!("{what}: got an event for CQ context {c:#x}"),
    }
}
