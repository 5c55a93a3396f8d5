//! `err.*`: every row of docs/design.md §3.4's error table: local protection
//! errors, bad keys in the responder's receive WQE, remote access errors
//! (bad rkey, range, permission), receive too short, RNR (retry counts and
//! infinite), UD/UC drops, and a vanished peer (retry exhausted).

use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail};

type R<T> = std::result::Result<T, Stop>;

const RULE_TABLE: &str = "docs/design.md §3.4 (error table)";

fn pair(env: &Env, cfg: PairConfig) -> R<Pair> {
    Ok(Pair::new(&env.a, &env.b, cfg)?)
}

pub(crate) fn register(out: &mut Vec<Case>) {
    local(out);
    responder_recv(out);
    remote_access(out);
    lengths(out);
    rnr(out);
    drops(out);
    peer_gone(out);
    register_more(out);
}

/// Posts `wr` signaled on A and checks it completes with `status`, A goes
/// to ERR, and B stays in `b_state` without a receive completion.
fn expect_failure(p: &Pair, wr: SendWr<'_>, status: WcStatus, b_state: QpState) -> Check {
    let id = wr.wr_id;
    p.a.post(wr.flags(wr.send_flags | SendFlags::SIGNALED))?;
    let wc = expect_one(&p.a.scq, "completion of the failing WR")?;
    check_wc(&wc, id, status, None, "requester completion")?;
    ensure_eq!(wc.qp_num, p.a.qp.qp_num(), "qp_num of the error completion");
    expect_state(&p.a.qp, QpState::Err, "the requester after the error")?;
    expect_state(&p.b.qp, b_state, "the responder")?;
    expect_quiet(&p.b.rcq, "the responder's receive CQ")
}

fn local(out: &mut Vec<Case>) {
    out.push(Case::new(
        "err.rc.local.lkey_other_pd",
        "a send whose SGE names an MR of another PD completes LOC_PROT_ERR; only the requester goes to ERR",
        "docs/design.md §3.4 (bad lkey, local: LOC_PROT_ERR, requester to ERR); IBTA 10.6.3.1",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let other = env.a.alloc_pd()?;
            let foreign = other.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            p.b.post_recv(1, 0, 4096)?;
            let sge = [foreign.sge(0, 64)?];
            p.a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 2, WcStatus::LocProtErr, None, "send with a foreign lkey")?;
            expect_state(&p.a.qp, QpState::Err, "the requester")?;
            expect_state(&p.b.qp, QpState::Rts, "the responder")?;
            expect_quiet(&p.b.rcq, "the responder's receive CQ")
        },
    ));
    out.push(Case::new(
        "err.rc.local.lkey_invalid",
        "a write whose SGE carries an lkey that names no MR completes LOC_PROT_ERR",
        "docs/design.md §3.4 (bad lkey, local)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let good = p.a.mr.sge(0, 64)?;
            // SAFETY: the range is inside A's registered MR, which outlives
            // the WR; only the key is wrong, and the device must refuse it.
            let bad = [unsafe { Sge::from_raw(good.addr(), 64, p.a.mr.lkey() ^ 0xff) }];
            let op = SendOp::Write {
                remote: p.b.mr.remote(0),
            };
            p.a.post(SendWr::new(3, op, &bad).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "write completion")?;
            check_wc(&wc, 3, WcStatus::LocProtErr, None, "write with an invalid lkey")?;
            ensure_eq!(p.b.mr.to_vec(0, 64)?, vec![0u8; 64], "remote memory");
            expect_state(&p.b.qp, QpState::Rts, "the responder")
        },
    ));
    out.push(Case::new(
        "err.rc.local.sge_outside_mr",
        "a write whose SGE runs past the end of its MR completes LOC_PROT_ERR",
        "docs/design.md §3.4 (SGE outside MR, local: LOC_PROT_ERR)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let big = p.a.pd.alloc_mr(16 * 1024, AccessFlags::LOCAL_WRITE)?;
            // SAFETY: the region is the first 4 KiB of `big`'s buffer, which
            // lives until `big` is dropped, after `small` (declared later,
            // dropped first); no Rust reference into it exists.
            let region = unsafe { RawRegion::new(big.addr() as *mut u8, 4096) };
            let small = p.a.pd.reg_mr_raw(region, AccessFlags::LOCAL_WRITE)?;
            // SAFETY: the range lies in `big`'s registered buffer (alive for
            // the whole WR); it crosses the end of `small`'s registration,
            // which the device must refuse.
            let sge = [unsafe { Sge::from_raw(small.addr() + 4096 - 32, 64, small.lkey()) }];
            let op = SendOp::Write {
                remote: p.b.mr.remote(0),
            };
            p.a.post(SendWr::new(4, op, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "write completion")?;
            check_wc(&wc, 4, WcStatus::LocProtErr, None, "write with an SGE past its MR")?;
            expect_state(&p.a.qp, QpState::Err, "the requester")
        },
    ));
    out.push(Case::new(
        "err.rc.local.read_sink_without_local_write",
        "an RDMA read into an MR without LOCAL_WRITE completes LOC_PROT_ERR",
        "docs/design.md §3.4; ibv_reg_mr(3) (the device writes local memory only with LOCAL_WRITE)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let ro = p.a.pd.alloc_mr(4096, AccessFlags::empty())?;
            let sge = [ro.sge(0, 64)?];
            let op = SendOp::Read {
                remote: p.b.mr.remote(0),
            };
            p.a.post(SendWr::new(5, op, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "read completion")?;
            check_wc(&wc, 5, WcStatus::LocProtErr, None, "read into a read-only MR")
        },
    ));
    out.push(Case::new(
        "err.rc.local.atomic_sink_without_local_write",
        "an atomic whose result buffer lacks LOCAL_WRITE completes LOC_PROT_ERR",
        "docs/design.md §3.4; ibv_reg_mr(3)",
        &[Cap::Atomics],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let ro = p.a.pd.alloc_mr(4096, AccessFlags::empty())?;
            let sge = [ro.sge(0, 8)?];
            let op = SendOp::FetchAdd {
                remote: p.b.mr.remote(0),
                add: 1,
            };
            p.a.post(SendWr::new(6, op, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "atomic completion")?;
            check_wc(&wc, 6, WcStatus::LocProtErr, None, "atomic into a read-only MR")
        },
    ));
}

fn responder_recv(out: &mut Vec<Case>) {
    for (id, what, foreign_pd) in [
        ("err.rc.recv.lkey_other_pd", "an MR of another PD", true),
        ("err.rc.recv.mr_without_local_write", "an MR without LOCAL_WRITE", false),
    ] {
        out.push(Case::new(
            id,
            format!("a send into a receive WQE whose SGE names {what}: REM_OP_ERR at the requester, LOC_PROT_ERR at the responder, both QPs in ERR"),
            "docs/design.md §3.4 (bad lkey in responder's receive WQE); IBTA 9.9.3.1.3",
            &[],
            move |env: &Env| {
                let p = pair(env, PairConfig::default())?;
                let other = env.b.alloc_pd()?;
                let mr = match foreign_pd {
                    true => other.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?,
                    false => p.b.pd.alloc_mr(4096, AccessFlags::empty())?,
                };
                let rsge = [mr.sge(0, 4096)?];
                p.b.qp.post_recv(&[RecvWr::new(7, &rsge)])?;
                let sge = [p.a.mr.sge(0, 64)?];
                p.a.post(SendWr::new(8, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
                let wc = expect_one(&p.a.scq, "send completion")?;
                check_wc(&wc, 8, WcStatus::RemOpErr, None, "requester completion")?;
                let r = expect_one(&p.b.rcq, "responder receive completion")?;
                check_wc(&r, 7, WcStatus::LocProtErr, None, "responder receive completion")?;
                ensure_eq!(r.qp_num, p.b.qp.qp_num(), "responder completion qp_num");
                expect_state(&p.a.qp, QpState::Err, "the requester")?;
                expect_state(&p.b.qp, QpState::Err, "the responder")
            },
        ));
    }
}

/// How a remote access case spoils the request.
#[derive(Clone, Copy)]
enum Spoil {
    /// The rkey names no MR.
    BadRkey,
    /// The range runs past the end of the MR.
    OutOfRange,
    /// The target MR lacks the right (registered with LOCAL_WRITE only).
    MrLacksRight,
    /// The responder QP's access flags lack the right.
    QpLacksRight,
    /// The rkey belongs to an MR of another PD on the responder.
    OtherPd,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Atomic,
}

fn remote_access(out: &mut Vec<Case>) {
    let spoils = [
        ("bad_rkey", Spoil::BadRkey, "an rkey that names no MR"),
        ("out_of_range", Spoil::OutOfRange, "a range past the end of the MR"),
        (
            "mr_lacks_permission",
            Spoil::MrLacksRight,
            "an MR without the remote right",
        ),
        (
            "qp_lacks_permission",
            Spoil::QpLacksRight,
            "a responder QP without the remote right",
        ),
        ("rkey_other_pd", Spoil::OtherPd, "an rkey of another PD's MR"),
    ];
    for (op_name, op) in [("write", Op::Write), ("read", Op::Read), ("atomic", Op::Atomic)] {
        for (sp_name, spoil, what) in spoils {
            let caps: &[Cap] = if op == Op::Atomic { &[Cap::Atomics] } else { &[] };
            out.push(Case::new(
                format!("err.rc.{op_name}.{sp_name}"),
                format!("an RC {op_name} to {what} completes REM_ACCESS_ERR, both QPs go to ERR, the responder reports no CQE"),
                "docs/design.md §3.4 (bad rkey / range / missing remote permission: REM_ACCESS_ERR); IBTA 9.7.5.1.3",
                caps,
                move |env: &Env| remote_fail(env, op, spoil),
            ));
        }
    }
    out.push(Case::new(
        "err.rc.write_imm.bad_rkey",
        "a write with immediate to a bad rkey completes REM_ACCESS_ERR and consumes no receive (it flushes)",
        RULE_TABLE,
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            p.b.post_recv(9, 0, 64)?;
            let sge = [p.a.mr.sge(0, 64)?];
            let remote = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(SendWr::new(1, SendOp::WriteWithImm { remote, imm: 5 }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "write completion")?;
            check_wc(
                &wc,
                1,
                WcStatus::RemAccessErr,
                None,
                "write with immediate to a bad rkey",
            )?;
            let r = expect_one(&p.b.rcq, "the responder's receive")?;
            check_wc(
                &r,
                9,
                WcStatus::WrFlushErr,
                None,
                "the responder's receive (flushed, not consumed)",
            )?;
            expect_state(&p.b.qp, QpState::Err, "the responder")
        },
    ));
    out.push(Case::new(
        "err.rc.write.bad_rkey_async_event",
        "a remote access error raises QP_ACCESS_ERR for the responder's QP on the responder's context",
        "IBTA 11.6.3.1 (local access violation work queue error); ibv_get_async_event(3)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 64)?];
            let remote = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(SendWr::new(1, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "write completion")?;
            let qpn = p.b.qp.qp_num();
            let ev = wait_async(&p.b.ctx, WAIT, |e| e.element == AsyncElement::Qp(qpn))?;
            match ev {
                Some(e) => ensure_eq!(e.event_type, EventType::QpAccessErr, "responder QP event"),
                None => fail!("no async event for the responder QP within {WAIT:?}"),
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "err.rc.responder_error_flushes_its_receives",
        "after a remote access error the responder's posted receives flush with WR_FLUSH_ERR in post order",
        "docs/design.md §3.4 (both QPs to ERR; everything outstanding flushes)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            for i in 0..3 {
                p.b.post_recv(20 + i, i * 64, 64)?;
            }
            let sge = [p.a.mr.sge(0, 64)?];
            let remote = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(SendWr::new(1, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "write completion")?;
            let rs = expect_n(&p.b.rcq, 3, "flushed receives")?;
            let got: Vec<(u64, WcStatus)> = rs.iter().map(|w| (w.wr_id, w.status)).collect();
            ensure_eq!(
                got,
                (20..23).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>(),
                "responder flushes"
            );
            Ok(())
        },
    ));
}

fn remote_fail(env: &Env, op: Op, spoil: Spoil) -> Check {
    let mut cfg = PairConfig::default();
    let right = match op {
        Op::Write => AccessFlags::REMOTE_WRITE,
        Op::Read => AccessFlags::REMOTE_READ,
        Op::Atomic => AccessFlags::REMOTE_ATOMIC,
    };
    if let Spoil::QpLacksRight = spoil {
        cfg.qp_access -= right;
    }
    let p = pair(env, cfg)?;
    let full = Env::full_access();
    let other = env.b.alloc_pd()?;
    let target = match spoil {
        Spoil::MrLacksRight => p.b.pd.alloc_mr(4096, full - right)?,
        Spoil::OtherPd => other.alloc_mr(4096, full)?,
        _ => p.b.pd.alloc_mr(4096, full)?,
    };
    let len: u32 = if op == Op::Atomic { 8 } else { 64 };
    let mut remote = target.remote(0);
    match spoil {
        Spoil::BadRkey => remote.rkey ^= 0xff,
        // Straddle the end of the MR; an atomic (8-aligned) starts at it.
        Spoil::OutOfRange => remote.addr = target.addr() + 4096 - if op == Op::Atomic { 0 } else { 32 },
        _ => {}
    }
    let sge = [p.a.mr.sge(0, len)?];
    let sop = match op {
        Op::Write => SendOp::Write { remote },
        Op::Read => SendOp::Read { remote },
        Op::Atomic => SendOp::FetchAdd { remote, add: 1 },
    };
    expect_failure(&p, SendWr::new(1, sop, &sge), WcStatus::RemAccessErr, QpState::Err)?;
    ensure!(
        target.to_vec(0, 4096)?.iter().all(|&b| b == 0),
        "the target memory changed despite the access error"
    );
    Ok(())
}

fn lengths(out: &mut Vec<Case>) {
    for (id, len, rlen, mtu) in [
        ("err.rc.send_too_long.single_packet", 200u32, 100u32, Mtu::Mtu1024),
        ("err.rc.send_too_long.multi_packet", 3000, 1500, Mtu::Mtu1024),
    ] {
        out.push(Case::new(
            id,
            format!("an RC send of {len} bytes into a {rlen}-byte receive: REM_INV_REQ_ERR at the requester, LOC_LEN_ERR at the responder, both in ERR"),
            "docs/design.md §3.4 (RC send longer than the receive buffer); IBTA 9.7.5.1.5",
            &[],
            move |env: &Env| {
                let p = pair(env, PairConfig { mtu, ..PairConfig::default() })?;
                p.b.post_recv(1, 0, rlen)?;
                let sge = [p.a.mr.sge(0, len)?];
                p.a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
                let wc = expect_one(&p.a.scq, "send completion")?;
                check_wc(&wc, 2, WcStatus::RemInvReqErr, None, "requester completion")?;
                let r = expect_one(&p.b.rcq, "receive completion")?;
                check_wc(&r, 1, WcStatus::LocLenErr, None, "responder completion")?;
                expect_state(&p.a.qp, QpState::Err, "the requester")?;
                expect_state(&p.b.qp, QpState::Err, "the responder")
            },
        ));
    }
    out.push(Case::new(
        "err.rc.send_too_long_async_event",
        "a receive too short for the message raises QP_REQ_ERR for the responder's QP",
        "IBTA 11.6.3.1 (invalid request local work queue error); ibv_get_async_event(3)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            p.b.post_recv(1, 0, 10)?;
            let sge = [p.a.mr.sge(0, 100)?];
            p.a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "send completion")?;
            let qpn = p.b.qp.qp_num();
            match wait_async(&p.b.ctx, WAIT, |e| e.element == AsyncElement::Qp(qpn))? {
                Some(e) => ensure_eq!(e.event_type, EventType::QpReqErr, "responder QP event"),
                None => fail!("no async event for the responder QP within {WAIT:?}"),
            }
            Ok(())
        },
    ));
}

fn rnr(out: &mut Vec<Case>) {
    for retries in [0u8, 1, 3] {
        out.push(Case::new(
            format!("err.rc.rnr.retry_{retries}"),
            format!("an RC send with no receive posted and rnr_retry {retries} ends in RNR_RETRY_EXC_ERR; the responder stays RTS"),
            "docs/design.md §3.4 (no receive posted, RC: RNR NAK, retried rnr_retry times, then RNR_RETRY_EXC_ERR); IBTA 9.7.5.2.8",
            &[],
            move |env: &Env| {
                let p = pair(env, PairConfig { rnr_retry: retries, min_rnr_timer: 1, ..PairConfig::default() })?;
                let sge = [p.a.mr.sge(0, 32)?];
                let wc = {
                    p.a.post(SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
                    expect_one(&p.a.scq, "send completion")?
                };
                check_wc(&wc, 1, WcStatus::RnrRetryExcErr, None, "send without a receive")?;
                expect_state(&p.a.qp, QpState::Err, "the requester")?;
                expect_state(&p.b.qp, QpState::Rts, "the responder")?;
                expect_quiet(&p.b.rcq, "the responder's receive CQ")
            },
        ));
    }
    out.push(Case::new(
        "err.rc.rnr.timer_honoured",
        "with min_rnr_timer 18 (5.12 ms) and rnr_retry 2 the requester waits at least 2 RNR timers before RNR_RETRY_EXC_ERR",
        "IBTA 9.7.5.2.8 and table 45 (RNR NAK timer field encoding); docs/design.md §3.7",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig { rnr_retry: 2, min_rnr_timer: 18, ..PairConfig::default() })?;
            let sge = [p.a.mr.sge(0, 8)?];
            let start = std::time::Instant::now();
            p.a.post(SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            let took = start.elapsed();
            check_wc(&wc, 1, WcStatus::RnrRetryExcErr, None, "send without a receive")?;
            ensure!(
                took >= std::time::Duration::from_micros(2 * 5120),
                "RNR_RETRY_EXC_ERR after {took:?}: less than 2 RNR timers of 5.12 ms"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "err.rc.rnr.write_imm_needs_recv",
        "an RC write with immediate and no receive posted is RNR NAK'd like a send (rnr_retry 0: RNR_RETRY_EXC_ERR)",
        "docs/design.md §3.5 (write-with-immediate consumes a receive WQE), §3.4",
        &[],
        |env: &Env| {
            let p = pair(
                env,
                PairConfig {
                    rnr_retry: 0,
                    ..PairConfig::default()
                },
            )?;
            let sge = [p.a.mr.sge(0, 32)?];
            let op = SendOp::WriteWithImm {
                remote: p.b.mr.remote(0),
                imm: 3,
            };
            p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "write completion")?;
            check_wc(
                &wc,
                1,
                WcStatus::RnrRetryExcErr,
                None,
                "write with immediate without a receive",
            )?;
            expect_state(&p.b.qp, QpState::Rts, "the responder")
        },
    ));
    out.push(Case::new(
        "err.rc.rnr.infinite_then_recv",
        "with rnr_retry 7 (infinite) a send without a receive waits, then completes once a receive is posted",
        "docs/design.md §3.4 (rnr_retry 7 = forever); IBTA 9.7.5.2.8",
        &[],
        |env: &Env| {
            let p = pair(
                env,
                PairConfig {
                    rnr_retry: 7,
                    min_rnr_timer: 1,
                    ..PairConfig::default()
                },
            )?;
            p.a.mr.write(0, b"patience")?;
            let sge = [p.a.mr.sge(0, 8)?];
            p.a.post(SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            expect_quiet(&p.a.scq, "a send waiting on RNR")?;
            expect_state(&p.a.qp, QpState::Rts, "the requester while waiting")?;
            p.b.post_recv(2, 0, 64)?;
            // The requester's CQ first: waiting there is what lets a
            // progress-on-poll backend run the requester's RNR timer.
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 1, WcStatus::Success, Some(WcOpcode::Send), "send after RNR")?;
            let r = expect_one(&p.b.rcq, "the late receive")?;
            check_wc(&r, 2, WcStatus::Success, Some(WcOpcode::Recv), "the late receive")?;
            ensure_eq!(p.b.mr.to_vec(0, 8)?, b"patience".to_vec(), "received data");
            Ok(())
        },
    ));
}

fn drops(out: &mut Vec<Case>) {
    for t in [QpType::Uc, QpType::Ud] {
        let tl = t.name().to_lowercase();
        let caps: &[Cap] = if t == QpType::Uc { &[Cap::Uc] } else { &[Cap::Ud] };
        out.push(Case::new(
            format!("err.{tl}.sqe.receive_continues_and_rts_recovers"),
            format!(
                "a {t} send error completes LOC_PROT_ERR and takes the QP to SQE: the rest of the send queue and \
                 sends posted in SQE flush, receives still complete, and SQE->RTS sends again"
            ),
            "IBTA 10.3.1 (Send Queue Error state: UD and UC; the receive queue keeps working); IBTA 11.2.4.2 \
             (SQE->RTS)",
            caps,
            move |env: &Env| send_queue_error(env, t),
        ));
        out.push(Case::new(
            format!("err.{tl}.no_recv_dropped"),
            format!("a {t} send with no receive posted completes SUCCESS at the sender and is dropped; the next message is received"),
            "docs/design.md §3.4 (no receive posted, UD/UC: SUCCESS, message dropped)",
            caps,
            move |env: &Env| {
                let c = super::data::Conn::new(env, t, Mtu::Mtu1024)?;
                let p = &c.p;
                p.a.mr.write(0, b"first")?;
                p.a.mr.write(64, b"second")?;
                let s1 = [p.a.mr.sge(0, 5)?];
                p.a.post(c.wr(1, SendOp::Send, &s1, SendFlags::SIGNALED))?;
                let wc = expect_one(&p.a.scq, "send completion")?;
                check_wc(&wc, 1, WcStatus::Success, Some(WcOpcode::Send), "send without a receive")?;
                expect_quiet(&p.b.rcq, "the receiver")?;
                expect_state(&p.b.qp, QpState::Rts, "the receiver")?;
                expect_state(&p.a.qp, QpState::Rts, "the sender")?;
                p.b.post_recv(2, 0, 1024)?;
                let s2 = [p.a.mr.sge(64, 6)?];
                p.a.post(c.wr(3, SendOp::Send, &s2, SendFlags::SIGNALED))?;
                expect_one(&p.a.scq, "second send completion")?;
                let r = expect_one(&p.b.rcq, "receive of the second message")?;
                check_wc(&r, 2, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                let off = if t == QpType::Ud { super::data::GRH } else { 0 };
                ensure_eq!(p.b.mr.to_vec(off as u64, 6)?, b"second".to_vec(), "received message (the second)");
                Ok(())
            },
        ));
    }
    out.push(Case::new(
        "err.uc.write.bad_rkey_dropped",
        "a UC write to a bad rkey completes SUCCESS at the sender and is dropped; both QPs stay RTS",
        "docs/design.md §3.4 (bad rkey: UC dropped); IBTA 9.8.3",
        &[Cap::Uc],
        |env: &Env| {
            let c = super::data::Conn::new(env, QpType::Uc, Mtu::Mtu1024)?;
            let p = &c.p;
            let sge = [p.a.mr.sge(0, 64)?];
            let remote = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(c.wr(1, SendOp::Write { remote }, &sge, SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "write completion")?;
            check_wc(
                &wc,
                1,
                WcStatus::Success,
                Some(WcOpcode::RdmaWrite),
                "UC write to a bad rkey",
            )?;
            expect_state(&p.a.qp, QpState::Rts, "the sender")?;
            expect_state(&p.b.qp, QpState::Rts, "the receiver")?;
            p.a.mr.write(0, b"still connected")?;
            let sge = [p.a.mr.sge(0, 15)?];
            p.a.post(c.wr(
                2,
                SendOp::Write {
                    remote: p.b.mr.remote(0),
                },
                &sge,
                SendFlags::SIGNALED,
            ))?;
            expect_one(&p.a.scq, "second write completion")?;
            ensure_eq!(
                p.b.mr.to_vec(0, 15)?,
                b"still connected".to_vec(),
                "data of the next write"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "err.ud.wrong_qkey_dropped",
        "a UD send with a Q_Key other than the receiver's is dropped silently; the sender sees SUCCESS",
        "IBTA 10.2.5 (Q_Key violation: the packet is dropped)",
        &[Cap::Ud],
        |env: &Env| {
            let c = super::data::Conn::new(env, QpType::Ud, Mtu::Mtu1024)?;
            let p = &c.p;
            let ah = c.ah.as_ref().expect("UD pair has an AH");
            p.b.post_recv(1, 0, 1024)?;
            let sge = [p.a.mr.sge(0, 16)?];
            let wr = SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED).ud(
                ah,
                p.b.qp.qp_num(),
                p.cfg.qkey ^ 0x0101,
            );
            p.a.post(wr)?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(
                &wc,
                2,
                WcStatus::Success,
                Some(WcOpcode::Send),
                "send with a wrong Q_Key",
            )?;
            expect_quiet(&p.b.rcq, "the receiver")
        },
    ));
}

fn peer_gone(out: &mut Vec<Case>) {
    for (id, how, retry_cnt, read) in [
        ("err.rc.peer_destroyed.retry_exc", "destroyed", 2u8, false),
        ("err.rc.peer_destroyed.retry_0", "destroyed", 0, false),
        ("err.rc.peer_reset.retry_exc", "moved to RESET", 2, false),
        ("err.rc.peer_destroyed.read_retry_exc", "destroyed", 1, true),
    ] {
        out.push(Case::new(
            id,
            format!(
                "a {} to a peer QP that was {how}, with retry_cnt {retry_cnt} and timeout 8, ends in RETRY_EXC_ERR",
                if read { "read" } else { "write" }
            ),
            "docs/design.md §3.4 (peer gone: after retry_cnt timeouts of 4.096 us * 2^timeout, RETRY_EXC_ERR); IBTA 9.7.6.1.1",
            &[],
            move |env: &Env| {
                let cfg = PairConfig {
                    timeout: 8,
                    retry_cnt,
                    ..PairConfig::default()
                };
                let mut p = Pair::new(&env.a, &env.b, cfg.clone())?;
                match how {
                    "destroyed" => {
                        // Replace B's QP by a fresh one in RESET and destroy the old.
                        let fresh = create_qp(&p.b.pd, QpType::Rc, &p.b.scq, &p.b.rcq, None, cfg.cap)?;
                        let old = std::mem::replace(&mut p.b.qp, fresh);
                        old.destroy()?;
                    }
                    _ => p.b.move_to(QpState::Reset)?,
                }
                let sge = [p.a.mr.sge(0, 64)?];
                let op = match read {
                    true => SendOp::Read {
                        remote: p.b.mr.remote(0),
                    },
                    false => SendOp::Write {
                        remote: p.b.mr.remote(0),
                    },
                };
                p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED))?;
                let wc = expect_one(&p.a.scq, "completion")?;
                check_wc(&wc, 1, WcStatus::RetryExcErr, None, "operation towards a vanished peer")?;
                expect_state(&p.a.qp, QpState::Err, "the requester")
            },
        ));
    }
    out.push(Case::new(
        "err.rc.peer_destroyed.timeout_honoured",
        "with timeout 10 (4.2 ms) and retry_cnt 2 the requester waits at least 3 local ACK timeouts before RETRY_EXC_ERR",
        "IBTA 9.7.6.1.3 (local ACK timeout 4.096 us * 2^timeout); docs/design.md §3.7",
        &[],
        |env: &Env| {
            let cfg = PairConfig { timeout: 10, retry_cnt: 2, ..PairConfig::default() };
            let mut p = Pair::new(&env.a, &env.b, cfg.clone())?;
            let fresh = create_qp(&p.b.pd, QpType::Rc, &p.b.scq, &p.b.rcq, None, cfg.cap)?;
            std::mem::replace(&mut p.b.qp, fresh).destroy()?;
            let sge = [p.a.mr.sge(0, 8)?];
            let start = std::time::Instant::now();
            p.a.post(SendWr::new(1, SendOp::Write { remote: p.b.mr.remote(0) }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "completion")?;
            let took = start.elapsed();
            check_wc(&wc, 1, WcStatus::RetryExcErr, None, "write towards a destroyed QP")?;
            let floor = std::time::Duration::from_nanos(3 * 4096 * 1024);
            ensure!(took >= floor, "RETRY_EXC_ERR after {took:?}, below 3 timeouts ({floor:?})");
            Ok(())
        },
    ));
    out.push(Case::new(
        "err.rc.atomic.misaligned_at_responder",
        "a misaligned atomic reaching the responder is NAK'd invalid request: the requester completes \
         REM_INV_REQ_ERR, both QPs go to ERR, the responder hears QP_REQ_ERR and its memory is untouched",
        "docs/design.md §3.4 (misaligned atomic reaching the responder: REM_INV_REQ_ERR, both to ERR); IBTA 9.4.5 \
         (atomic VA must be 8-byte aligned), 9.7.5.2.7",
        &[Cap::Atomics],
        misaligned_atomic_at_responder,
    ));
}

/// A local protection error on a UC or UD QP: SQE, not ERR (IBTA 10.3.1).
/// A backend that takes the QP to ERR instead is skipped, as the SQE rows
/// of the state table are (`qp.state.<t>.sqe_to_*`).
fn send_queue_error(env: &Env, t: QpType) -> Check {
    let c = super::data::Conn::new(env, t, Mtu::Mtu1024)?;
    let p = &c.p;
    let grh = if t == QpType::Ud { super::data::GRH } else { 0 };
    p.a.post_recv(20, 4096, 1024)?;
    p.b.post_recv(10, 0, 1024)?;
    let other = env.a.alloc_pd()?;
    let foreign = other.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let bad = [foreign.sge(0, 16)?];
    p.a.mr.write(0, b"recovered")?;
    let good = [p.a.mr.sge(0, 9)?];
    let wrs = [
        c.wr(1, SendOp::Send, &bad, SendFlags::SIGNALED),
        c.wr(2, SendOp::Send, &good, SendFlags::SIGNALED),
    ];
    p.a.qp.post_send(&wrs)?;
    let wc = expect_n(&p.a.scq, 2, "completions of the failed send and the one after it")?;
    check_wc(&wc[0], 1, WcStatus::LocProtErr, None, "the send with a foreign lkey")?;
    check_wc(&wc[1], 2, WcStatus::WrFlushErr, None, "the send queued behind it")?;
    let state = p.a.state()?;
    if state == QpState::Err {
        crate::skip!("after a send error the backend moved the {t} QP to ERR, not SQE (only the device enters SQE)");
    }
    ensure_eq!(state, QpState::Sqe, "the sender after the send error");
    // A send posted in SQE is accepted and flushed; nothing reaches B.
    p.a.post(c.wr(3, SendOp::Send, &good, SendFlags::SIGNALED))?;
    let wc = expect_one(&p.a.scq, "completion of a send posted in SQE")?;
    check_wc(&wc, 3, WcStatus::WrFlushErr, None, "a send posted in SQE")?;
    expect_quiet(&p.b.rcq, "the receiver while the sender is in SQE")?;
    // The receive queue keeps working: B sends to A.
    p.b.mr.write(2048, b"to A")?;
    let back = [p.b.mr.sge(2048, 4)?];
    let ah_ba = match t {
        QpType::Ud => Some(p.b.ah_to(&p.a)?),
        _ => None,
    };
    let mut wr = SendWr::new(30, SendOp::Send, &back).flags(SendFlags::SIGNALED);
    if let Some(ah) = &ah_ba {
        wr = wr.ud(ah, p.a.qp.qp_num(), p.cfg.qkey);
    }
    p.b.post(wr)?;
    check_wc(
        &expect_one(&p.b.scq, "B's send")?,
        30,
        WcStatus::Success,
        None,
        "B's send",
    )?;
    let r = expect_one(&p.a.rcq, "the receive of a QP in SQE")?;
    check_wc(
        &r,
        20,
        WcStatus::Success,
        Some(WcOpcode::Recv),
        "the receive of a QP in SQE",
    )?;
    ensure_eq!(
        p.a.mr.to_vec(4096 + grh as u64, 4)?,
        b"to A".to_vec(),
        "the message received in SQE"
    );
    expect_state(&p.a.qp, QpState::Sqe, "the sender after receiving")?;
    // SQE->RTS with the bare STATE bit: sending works again.
    p.a.move_to(QpState::Rts)?;
    expect_state(&p.a.qp, QpState::Rts, "after SQE->RTS")?;
    p.a.post(c.wr(4, SendOp::Send, &good, SendFlags::SIGNALED))?;
    check_wc(
        &expect_one(&p.a.scq, "the send after recovery")?,
        4,
        WcStatus::Success,
        None,
        "the send after recovery",
    )?;
    let r = expect_one(&p.b.rcq, "the receive of the send after recovery")?;
    check_wc(
        &r,
        10,
        WcStatus::Success,
        Some(WcOpcode::Recv),
        "the receive after recovery",
    )?;
    ensure_eq!(
        p.b.mr.to_vec(grh as u64, 9)?,
        b"recovered".to_vec(),
        "the message sent after recovery"
    );
    Ok(())
}

/// `post_send` rejects a misaligned atomic, so the request is crafted and
/// injected (soft provider only; skipped elsewhere). A's QP is connected to
/// a QP number B does not have, so the (aligned) atomic A posts is dropped
/// at B; the crafted copy, misaligned, carries A's PSN to B's real QP,
/// which is connected to A. B's NAK then answers A's own outstanding
/// atomic, so both ends of the rule are checked.
fn misaligned_atomic_at_responder(env: &Env) -> Check {
    use softverbs::soft::wire::{AtomicEthRepr, BthRepr, Opcode, PacketRepr, Psn, Qpn};
    require_injection(&env.dev_b)?;
    let cfg = PairConfig::default();
    let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
    // No QP on B has this number (QP numbers are allocated from the bottom).
    let nowhere = 0x00ff_fff0;
    p.a.to_init(&cfg)?;
    p.b.to_init(&cfg)?;
    qp_to_rtr(&p.a.qp, &cfg, p.a.gid_index, p.b.gid, nowhere, p.b.psn)?;
    p.b.to_rtr(&cfg, &p.a)?;
    p.a.to_rts(&cfg)?;
    p.b.to_rts(&cfg)?;
    p.b.post_recv(7, 0, 64)?;
    p.b.mr.fill(0, 16, 0x5a)?;
    let sink = [p.a.mr.sge(0, 8)?];
    let op = SendOp::CompareSwap {
        remote: p.b.mr.remote(0),
        compare: 0,
        swap: 1,
    };
    p.a.post(SendWr::new(1, op, &sink).flags(SendFlags::SIGNALED))?;
    let mut bth = BthRepr::new(Opcode::RcCompareSwap, Qpn::new(p.b.qp.qp_num()), Psn::new(p.a.psn));
    bth.ack_req = true;
    let mut h = PacketRepr::new(bth);
    h.atomic_eth = Some(AtomicEthRepr {
        va: p.b.mr.addr() + 4,
        rkey: p.b.mr.rkey(),
        swap_add: 0x1111_2222_3333_4444,
        compare: 0x5a5a_5a5a_5a5a_5a5a,
    });
    inject_packet(&env.dev_b, p.a.gid, &h, &[])?;
    let wc = expect_one(&p.a.scq, "completion of the atomic B answered")?;
    check_wc(&wc, 1, WcStatus::RemInvReqErr, None, "the requester")?;
    expect_state(&p.a.qp, QpState::Err, "the requester after the NAK")?;
    expect_state(&p.b.qp, QpState::Err, "the responder after the misaligned atomic")?;
    let ev = wait_async(&env.b, WAIT, |e| e.event_type == EventType::QpReqErr)?;
    ensure!(ev.is_some(), "the responder raised no QP_REQ_ERR async event");
    let flushed = expect_one(&p.b.rcq, "the responder's receive, flushed")?;
    check_wc(&flushed, 7, WcStatus::WrFlushErr, None, "the responder's receive")?;
    ensure_eq!(p.b.mr.to_vec(0, 16)?, vec![0x5a; 16], "the responder's memory");
    Ok(())
}

fn register_more(out: &mut Vec<Case>) {
    out.push(Case::new(
        "err.rc.rnr.retry_progresses_without_requester_polling",
        "a send held by RNR (rnr_retry 7) is delivered once a receive is posted, while only the responder's CQ is polled",
        "IBTA 9.7.5.2.8 (the requester retries on its own); ibv_poll_cq(3) (the transport does not wait for polling)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig { rnr_retry: 7, min_rnr_timer: 1, ..PairConfig::default() })?;
            let sge = [p.a.mr.sge(0, 8)?];
            p.a.post(SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            // From here on only B is touched: its receive, then its CQ.
            std::thread::sleep(std::time::Duration::from_millis(2));
            p.b.post_recv(2, 0, 64)?;
            let bound = std::time::Duration::from_secs(2);
            let r = wait_one(&p.b.rcq, bound)
                .map_err(|e| Stop::Fail(format!("the receive never completed while only B was polled: {e}")))?;
            check_wc(&r, 2, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 1, WcStatus::Success, Some(WcOpcode::Send), "send")
        },
    ));
    out.push(Case::new(
        "err.rc.rnr.mid_stream_resumes",
        "with one receive posted, three sends: the first lands, the second is RNR NAK'd until receives are posted, then all complete in order",
        "IBTA 9.7.5.2.8 (RNR NAK; the requester resends from the NAK'd PSN); docs/design.md §3.7",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig { rnr_retry: 7, min_rnr_timer: 1, mtu: Mtu::Mtu256, ..PairConfig::default() })?;
            p.b.post_recv(0, 0, 1024)?;
            let msgs: Vec<Vec<u8>> = (0..3).map(|i| pattern(600, 80 + i)).collect();
            for (i, m) in msgs.iter().enumerate() {
                p.a.mr.write(i as u64 * 1024, m)?;
            }
            let sgl: Vec<Sge<'_>> = (0..3).map(|i| p.a.mr.sge(i * 1024, 600)).collect::<Result<_>>()?;
            let wrs: Vec<SendWr<'_>> =
                (0..3).map(|i| SendWr::new(i as u64, SendOp::Send, &sgl[i..i + 1]).flags(SendFlags::SIGNALED)).collect();
            p.a.qp.post_send(&wrs)?;
            let first = expect_one(&p.a.scq, "first send")?;
            check_wc(&first, 0, WcStatus::Success, Some(WcOpcode::Send), "first send")?;
            expect_quiet(&p.a.scq, "sends waiting on RNR")?;
            p.b.post_recv(1, 1024, 1024)?;
            p.b.post_recv(2, 2048, 1024)?;
            let rest = expect_n(&p.a.scq, 2, "the other sends")?;
            check_wc(&rest[0], 1, WcStatus::Success, Some(WcOpcode::Send), "second send")?;
            check_wc(&rest[1], 2, WcStatus::Success, Some(WcOpcode::Send), "third send")?;
            let rs = expect_n(&p.b.rcq, 3, "receives")?;
            for (i, r) in rs.iter().enumerate() {
                check_wc(r, i as u64, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                ensure!(p.b.mr.to_vec(i as u64 * 1024, 600)? == msgs[i], "message {i} differs");
            }
            Ok(())
        },
    ));
}
