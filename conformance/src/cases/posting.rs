//! `post.*`: posting rules and errors (docs/design.md §3.3): state, SGE count,
//! inline size and opcode, opcode per QP type, atomic alignment, queue
//! full, and what a rejected list leaves posted.

use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq};

type R<T> = std::result::Result<T, Stop>;

pub(crate) fn register(out: &mut Vec<Case>) {
    for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
        let name = state.name().to_lowercase();
        out.push(Case::new(
            format!("post.send.in_{name}"),
            format!("post_send on an RC QP in {state} fails with EINVAL at WR 0 and nothing completes later"),
            "docs/design.md §3.3 (post_send before RTS: EINVAL); IBTA 10.8.2",
            &[],
            move |env: &Env| {
                let cfg = PairConfig::default();
                let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
                if state != QpState::Reset {
                    p.a.to_init(&cfg)?;
                    p.b.to_init(&cfg)?;
                }
                if state == QpState::Rtr {
                    p.a.to_rtr(&cfg, &p.b)?;
                }
                let sge = [p.a.mr.sge(0, 16)?];
                let remote = p.b.mr.remote(0);
                let r =
                    p.a.post(SendWr::new(1, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED));
                expect_post_err(r, 0, ErrorKind::InvalidArgument, &format!("post_send in {state}"))?;
                expect_quiet(&p.a.scq, "after the rejected post")
            },
        ));
    }
    out.push(Case::new(
        "post.recv.in_reset",
        "post_recv on a QP in RESET fails with EINVAL at WR 0",
        "docs/design.md §3.3 (post_recv in RESET: EINVAL); IBTA 10.8.2",
        &[],
        |env: &Env| {
            let p = Pair::unconnected(&env.a, &env.b, PairConfig::default())?;
            let sge = [p.b.mr.sge(0, 64)?];
            let r = p.b.qp.post_recv(&[RecvWr::new(1, &sge)]);
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "post_recv in RESET")
        },
    ));
    out.push(Case::new(
        "post.recv.in_init_then_used",
        "post_recv in INIT succeeds and the receive is used once the QP is connected",
        "IBTA 10.8.2 (receives may be posted from INIT)",
        &[],
        |env: &Env| {
            let cfg = PairConfig::default();
            let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
            p.a.to_init(&cfg)?;
            p.b.to_init(&cfg)?;
            p.b.post_recv(5, 0, 256)?;
            p.a.to_rtr(&cfg, &p.b)?;
            p.b.to_rtr(&cfg, &p.a)?;
            p.a.to_rts(&cfg)?;
            p.b.to_rts(&cfg)?;
            let sge = [p.a.mr.sge(0, 32)?];
            p.a.post(SendWr::new(6, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.b.rcq, "receive posted in INIT")?;
            check_wc(
                &wc,
                5,
                WcStatus::Success,
                Some(WcOpcode::Recv),
                "receive posted in INIT",
            )
        },
    ));
    out.push(Case::new(
        "post.send.too_many_sges",
        "a WR with more SGEs than max_send_sge fails with EINVAL at its index; the WR before it completes, the one after is not posted",
        "docs/design.md §3.3 (too many SGEs: EINVAL; nothing after the bad WR is posted)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let n = p.a.qp.cap().max_send_sge as usize + 1;
            let many: Vec<Sge<'_>> = (0..n).map(|i| p.a.mr.sge(i as u64, 1)).collect::<Result<_>>()?;
            let one = [p.a.mr.sge(0, 8)?];
            let remote = p.b.mr.remote(0);
            let op = SendOp::Write { remote };
            let s = SendFlags::SIGNALED;
            let wrs = [
                SendWr::new(1, op, &one).flags(s),
                SendWr::new(2, op, &many).flags(s),
                SendWr::new(3, op, &one).flags(s),
            ];
            expect_post_err(p.a.qp.post_send(&wrs), 1, ErrorKind::InvalidArgument, "post_send")?;
            only_first_completes(&p.a.scq, 1)
        },
    ));
    out.push(Case::new(
        "post.recv.too_many_sges",
        "a receive WR with more SGEs than max_recv_sge fails with EINVAL at its index",
        "docs/design.md §3.3 (too many SGEs: EINVAL)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let many = too_many_recv_sges(&p)?;
            let one = [p.b.mr.sge(0, 64)?];
            let wrs = [RecvWr::new(1, &one), RecvWr::new(2, &many), RecvWr::new(3, &one)];
            expect_post_err(p.b.qp.post_recv(&wrs), 1, ErrorKind::InvalidArgument, "post_recv")?;
            // Exactly one receive was posted: the first send lands in it,
            // the second finds none (RNR with rnr_retry 7 would wait, so
            // check by moving to ERR: exactly one flush).
            expect_flushed_in_order(&p, vec![1])
        },
    ));
    out.push(Case::new(
        "post.send.inline_too_large",
        "an INLINE send longer than max_inline_data fails with EINVAL",
        "docs/design.md §3.3 (inline over max_inline_data: EINVAL)",
        &[Cap::Inline],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let data = vec![7u8; p.a.qp.cap().max_inline_data as usize + 1];
            let sge = [Sge::inline(&data)];
            p.b.post_recv(1, 0, 4096)?;
            let r =
                p.a.post(SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "inline send too large")?;
            expect_quiet(&p.a.scq, "after the rejected post")
        },
    ));
    out.push(Case::new(
        "post.send.inline_on_read",
        "INLINE on an RDMA read fails with EINVAL",
        "docs/design.md §3.3, §3.5 (inline: send and RDMA write only)",
        &[Cap::Inline],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 16)?];
            let op = SendOp::Read {
                remote: p.b.mr.remote(0),
            };
            let r =
                p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "inline read")
        },
    ));
    out.push(Case::new(
        "post.send.inline_on_atomic",
        "INLINE on an atomic fails with EINVAL",
        "docs/design.md §3.3 (inline: send and RDMA write only)",
        &[Cap::Inline, Cap::Atomics],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 8)?];
            let op = SendOp::FetchAdd {
                remote: p.b.mr.remote(0),
                add: 1,
            };
            let r =
                p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "inline atomic")
        },
    ));
    out.push(Case::new(
        "post.send.atomic_misaligned_remote",
        "an atomic whose remote address is not 8-byte aligned fails with EINVAL",
        "docs/design.md §3.3 (misaligned atomic: EINVAL); IBTA 9.4.5",
        &[Cap::Atomics],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 8)?];
            let op = SendOp::CompareSwap {
                remote: p.b.mr.remote(4),
                compare: 0,
                swap: 1,
            };
            let r = p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "misaligned atomic")?;
            expect_quiet(&p.a.scq, "after the rejected atomic")?;
            ensure_eq!(p.b.mr.load_u64(0)?, 0, "remote word");
            Ok(())
        },
    ));
    out.push(Case::new(
        "post.send.atomic_short_sge",
        "an atomic whose local SGE is shorter than 8 bytes fails with EINVAL",
        "docs/design.md §3.3 (SGE under 8 bytes: EINVAL)",
        &[Cap::Atomics],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 4)?];
            let op = SendOp::FetchAdd {
                remote: p.b.mr.remote(0),
                add: 1,
            };
            let r = p.a.post(SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "atomic with a 4-byte SGE")
        },
    ));
    for (t, op_name) in [
        (QpType::Uc, "read"),
        (QpType::Uc, "cas"),
        (QpType::Uc, "faa"),
        (QpType::Ud, "write"),
        (QpType::Ud, "write_imm"),
        (QpType::Ud, "read"),
        (QpType::Ud, "cas"),
        (QpType::Ud, "faa"),
    ] {
        let tl = t.name().to_lowercase();
        let req: &[Cap] = if t == QpType::Uc { &[Cap::Uc] } else { &[Cap::Ud] };
        out.push(Case::new(
            format!("post.send.invalid_opcode.{tl}.{op_name}"),
            format!("posting {op_name} on a {t} QP fails with EINVAL"),
            "docs/design.md §3.3 (opcode not valid for the QP type); IBTA 9.8.3, 9.8.4 (UC: no read/atomic; UD: send only)",
            req,
            move |env: &Env| invalid_opcode(env, t, op_name),
        ));
    }
    out.push(Case::new(
        "post.send.sq_full",
        "posting max_send_wr + 2 WRs in one call fails with ENOMEM at index max_send_wr; the WRs before complete, none after",
        "docs/design.md §3.3 (queue full: ENOMEM; nothing after the bad WR is posted, nothing before is lost)",
        &[],
        |env: &Env| {
            let cfg = PairConfig {
                cap: QpCap { max_send_wr: 8, ..PairConfig::default().cap },
                sq_sig_all: true,
                ..PairConfig::default()
            };
            let p = Pair::new(&env.a, &env.b, cfg)?;
            let n = p.a.qp.cap().max_send_wr as usize;
            if n > 4096 {
                crate::skip!("the device granted {n} send WRs for 8");
            }
            let sge = [p.a.mr.sge(0, 8)?];
            let wrs: Vec<SendWr<'_>> = (0..n + 2)
                .map(|i| SendWr::new(i as u64, SendOp::Write { remote: p.b.mr.remote(8 * (i as u64 % 512)) }, &sge))
                .collect();
            expect_post_err(p.a.qp.post_send(&wrs), n, ErrorKind::NoMemory, "post_send of max_send_wr + 2")?;
            let wcs = expect_n(&p.a.scq, n, "completions of the posted WRs")?;
            for (i, wc) in wcs.iter().enumerate() {
                check_wc(wc, i as u64, WcStatus::Success, Some(WcOpcode::RdmaWrite), "posted WR")?;
            }
            expect_quiet(&p.a.scq, "after the posted WRs (none after the bad one)")
        },
    ));
    out.push(Case::new(
        "post.recv.rq_full",
        "posting max_recv_wr + 1 receives in one call fails with ENOMEM at index max_recv_wr",
        "docs/design.md §3.3 (queue full: ENOMEM)",
        &[],
        |env: &Env| {
            let p = small_rq_pair(env)?;
            let n = p.b.qp.cap().max_recv_wr as usize;
            let sge = [p.b.mr.sge(0, 64)?];
            let wrs: Vec<RecvWr<'_>> = (0..n + 1).map(|i| RecvWr::new(i as u64, &sge)).collect();
            expect_post_err(
                p.b.qp.post_recv(&wrs),
                n,
                ErrorKind::NoMemory,
                "post_recv of max_recv_wr + 1",
            )?;
            expect_flushed_in_order(&p, (0..n as u64).collect())
        },
    ));
    out.push(Case::new(
        "post.recv.rq_full_one_at_a_time",
        "receives posted one per call fill the queue at max_recv_wr; the next fails with ENOMEM at WR 0 and posts nothing; a consumed receive makes room again",
        "docs/design.md §3.3 (queue full: ENOMEM)",
        &[],
        |env: &Env| {
            let p = small_rq_pair(env)?;
            let n = u64::from(p.b.qp.cap().max_recv_wr);
            for i in 0..n {
                p.b.post_recv(i, 0, 64)?;
            }
            let sge = [p.b.mr.sge(0, 64)?];
            expect_post_err(
                p.b.qp.post_recv(&[RecvWr::new(n, &sge)]),
                0,
                ErrorKind::NoMemory,
                "post_recv into a full queue",
            )?;
            // One receive consumed: room for exactly one more.
            let one = [p.a.mr.sge(0, 8)?];
            p.a.post(SendWr::new(100, SendOp::Send, &one).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.b.rcq, "the receive the send consumed")?;
            check_wc(&wc, 0, WcStatus::Success, Some(WcOpcode::Recv), "first receive")?;
            expect_one(&p.a.scq, "the send")?;
            p.b.post_recv(n + 1, 0, 64)?;
            expect_post_err(
                p.b.qp.post_recv(&[RecvWr::new(n + 2, &sge)]),
                0,
                ErrorKind::NoMemory,
                "post_recv into the queue full again",
            )?;
            // The posted ones, in order; none of the rejected.
            expect_flushed_in_order(&p, (1..n).chain([n + 1]).collect())
        },
    ));
    out.push(Case::new(
        "post.recv.alone_too_many_sges",
        "a lone receive WR with more SGEs than max_recv_sge fails with EINVAL at WR 0 and posts nothing",
        "docs/design.md §3.3 (too many SGEs: EINVAL)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let many = too_many_recv_sges(&p)?;
            expect_post_err(
                p.b.qp.post_recv(&[RecvWr::new(1, &many)]),
                0,
                ErrorKind::InvalidArgument,
                "post_recv",
            )?;
            p.b.post_recv(2, 0, 64)?;
            // The rejected one was not posted.
            expect_flushed_in_order(&p, vec![2])
        },
    ));
    out.push(Case::new(
        "post.send.bad_first_wr_posts_nothing",
        "when the first WR of a list is rejected, none of the list is posted",
        "docs/design.md §3.3 (nothing after the bad WR is posted); ibv_post_send(3) bad_wr",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let n = p.a.qp.cap().max_send_sge as usize + 1;
            let many: Vec<Sge<'_>> = (0..n).map(|i| p.a.mr.sge(i as u64, 1)).collect::<Result<_>>()?;
            let one = [p.a.mr.sge(0, 8)?];
            let op = SendOp::Write {
                remote: p.b.mr.remote(0),
            };
            let wrs = [
                SendWr::new(1, op, &many).flags(SendFlags::SIGNALED),
                SendWr::new(2, op, &one).flags(SendFlags::SIGNALED),
            ];
            expect_post_err(p.a.qp.post_send(&wrs), 0, ErrorKind::InvalidArgument, "post_send")?;
            expect_quiet(&p.a.scq, "after a list rejected at WR 0")
        },
    ));
    out.push(Case::new(
        "post.send.in_err_flushes",
        "post_send on a QP in ERR succeeds and every WR (signaled or not) completes with WR_FLUSH_ERR",
        "docs/design.md §3.3 (posting to a QP in ERR flushes), §3.4",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            p.a.move_to(QpState::Err)?;
            let sge = [p.a.mr.sge(0, 8)?];
            let op = SendOp::Write {
                remote: p.b.mr.remote(0),
            };
            p.a.qp.post_send(&[
                SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED),
                SendWr::new(2, op, &sge),
            ])?;
            let wcs = expect_n(&p.a.scq, 2, "flushed sends")?;
            check_wc(&wcs[0], 1, WcStatus::WrFlushErr, None, "first flushed send")?;
            check_wc(&wcs[1], 2, WcStatus::WrFlushErr, None, "unsignaled flushed send")?;
            ensure_eq!(wcs[0].qp_num, p.a.qp.qp_num(), "qp_num of the flush completion");
            Ok(())
        },
    ));
    out.push(Case::new(
        "post.recv.in_err_flushes",
        "post_recv on a QP in ERR succeeds and the receive completes with WR_FLUSH_ERR",
        "docs/design.md §3.3, §3.4",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            p.b.move_to(QpState::Err)?;
            p.b.post_recv(4, 0, 64)?;
            let wc = expect_one(&p.b.rcq, "flushed receive")?;
            check_wc(&wc, 4, WcStatus::WrFlushErr, None, "receive posted in ERR")
        },
    ));
    out.push(Case::new(
        "post.send.in_sqd_deferred",
        "a WR posted in SQD is accepted, does not execute while drained, and completes after SQD->RTS",
        "IBTA 10.3.1 (SQD: new WRs are queued, not processed)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            p.a.move_to(QpState::Sqd)?;
            expect_state(&p.a.qp, QpState::Sqd, "after RTS->SQD")?;
            p.a.mr.write(0, b"deferred")?;
            let sge = [p.a.mr.sge(0, 8)?];
            p.a.post(
                SendWr::new(
                    9,
                    SendOp::Write {
                        remote: p.b.mr.remote(0),
                    },
                    &sge,
                )
                .flags(SendFlags::SIGNALED),
            )?;
            expect_quiet(&p.a.scq, "a WR posted in SQD")?;
            ensure_eq!(p.b.mr.to_vec(0, 8)?, vec![0u8; 8], "remote memory while in SQD");
            p.a.move_to(QpState::Rts)?;
            let wc = expect_one(&p.a.scq, "the deferred WR")?;
            check_wc(&wc, 9, WcStatus::Success, Some(WcOpcode::RdmaWrite), "deferred write")?;
            ensure_eq!(
                p.b.mr.to_vec(0, 8)?,
                b"deferred".to_vec(),
                "remote memory after SQD->RTS"
            );
            Ok(())
        },
    ));
    boundaries(out);
}

/// Waits for the completion of WR `first_id` and checks nothing else ever
/// completes.
fn only_first_completes(cq: &Cq, first_id: u64) -> Check {
    let wc = expect_one(cq, "completion of the WR before the rejected one")?;
    check_wc(&wc, first_id, WcStatus::Success, None, "WR before the rejected one")?;
    expect_quiet(cq, "after the rejected WR (nothing after it is posted)")
}

fn invalid_opcode(env: &Env, t: QpType, op_name: &str) -> Check {
    let cfg = PairConfig {
        qp_type: t,
        ..PairConfig::default()
    };
    let p = Pair::new(&env.a, &env.b, cfg.clone())?;
    let remote = p.b.mr.remote(0);
    let op = match op_name {
        "read" => SendOp::Read { remote },
        "cas" => SendOp::CompareSwap {
            remote,
            compare: 0,
            swap: 1,
        },
        "faa" => SendOp::FetchAdd { remote, add: 1 },
        "write" => SendOp::Write { remote },
        "write_imm" => SendOp::WriteWithImm { remote, imm: 1 },
        other => unreachable!("no opcode {other}"),
    };
    let sge = [p.a.mr.sge(0, 8)?];
    let ah = ud_ah(&p, t)?;
    let mut wr = SendWr::new(1, op, &sge).flags(SendFlags::SIGNALED);
    if let Some(ah) = &ah {
        wr = wr.ud(ah, p.b.qp.qp_num(), cfg.qkey);
    }
    expect_post_err(
        p.a.post(wr),
        0,
        ErrorKind::InvalidArgument,
        &format!("{op_name} on {t}"),
    )?;
    expect_quiet(&p.a.scq, "after the rejected post")?;
    ensure!(p.b.mr.load_u64(0)? == 0, "remote memory changed");
    Ok(())
}

/// An AH from A to B when `t` is UD.
fn ud_ah(p: &Pair, t: QpType) -> R<Option<Ah>> {
    Ok(match t {
        QpType::Ud => Some(p.a.ah_to(&p.b)?),
        _ => None,
    })
}

fn boundaries(out: &mut Vec<Case>) {
    out.push(Case::new(
        "post.send.max_sges_accepted",
        "a send with exactly max_send_sge SGEs into a receive of exactly max_recv_sge SGEs works",
        "ibv_create_qp(3) (the granted max_send_sge/max_recv_sge are usable)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let (ns, nr) = (p.a.qp.cap().max_send_sge as u64, p.b.qp.cap().max_recv_sge as u64);
            let want = pattern(ns as usize * 10, 90);
            p.a.mr.write(0, &want)?;
            let sgl: Vec<Sge<'_>> = (0..ns).map(|i| p.a.mr.sge(i * 10, 10)).collect::<Result<_>>()?;
            let rsgl: Vec<Sge<'_>> = (0..nr).map(|i| p.b.mr.sge(i * 1024, 1024)).collect::<Result<_>>()?;
            p.b.qp.post_recv(&[RecvWr::new(1, &rsgl)])?;
            p.a.post(SendWr::new(2, SendOp::Send, &sgl).flags(SendFlags::SIGNALED))?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(p.b.mr.to_vec(0, want.len())?, want, "received data");
            expect_one(&p.a.scq, "send completion")?;
            Ok(())
        },
    ));
    out.push(Case::new(
        "post.send.inline_max_accepted",
        "an INLINE send of exactly max_inline_data bytes is accepted and delivered",
        "ibv_create_qp(3) (max_inline_data is usable)",
        &[Cap::Inline],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.b, PairConfig::default())?;
            let n = p.a.qp.cap().max_inline_data as usize;
            let data = pattern(n, 91);
            p.b.post_recv(1, 0, 4096)?;
            let sge = [Sge::inline(&data)];
            p.a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE))?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(p.b.mr.to_vec(0, n)?, data, "received data");
            expect_one(&p.a.scq, "send completion")?;
            Ok(())
        },
    ));
}

/// A connected pair whose side B asked for 8 receive WRs (skipped when
/// the device grants over 4096: the cases fill the queue).
fn small_rq_pair(env: &Env) -> std::result::Result<Pair, Stop> {
    let cfg = PairConfig {
        cap: QpCap {
            max_recv_wr: 8,
            ..PairConfig::default().cap
        },
        ..PairConfig::default()
    };
    let p = Pair::new(&env.a, &env.b, cfg)?;
    let n = p.b.qp.cap().max_recv_wr;
    if n > 4096 {
        crate::skip!("the device granted {n} receive WRs for 8");
    }
    Ok(p)
}

/// Moves side B to ERR and checks that exactly the receives `ids` were
/// flushed, in that order.
/// One SGE more than `p.b`'s QP takes in a receive WR (64 bytes each).
fn too_many_recv_sges<'a>(p: &'a Pair) -> Result<Vec<Sge<'a>>> {
    let n = p.b.qp.cap().max_recv_sge as usize + 1;
    (0..n).map(|i| p.b.mr.sge(64 * i as u64, 64)).collect()
}

fn expect_flushed_in_order(p: &Pair, ids: Vec<u64>) -> Check {
    p.b.move_to(QpState::Err)?;
    let wcs = expect_n(&p.b.rcq, ids.len(), "flushed receives")?;
    let got: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ensure_eq!(got, ids, "flushed receives (the posted ones, in order)");
    expect_quiet(&p.b.rcq, "after the flushes")
}
