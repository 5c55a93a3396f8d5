//! `comp.*`: completion semantics (signaling, exactly once, FIFO, error
//! fields, flush order; docs/design.md §3.4) and `order.*`: ordering and fences
//! (docs/design.md §3.5).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use softverbs::verbs::*;

use crate::case::{Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail};

type R<T> = std::result::Result<T, Stop>;

fn pair(env: &Env, cfg: PairConfig) -> R<Pair> {
    Ok(Pair::new(&env.a, &env.b, cfg)?)
}

pub(crate) fn register(out: &mut Vec<Case>) {
    completions(out);
    flushes(out);
    ordering(out);
}

fn write_wr<'a>(p: &'a Pair, id: u64, sge: &'a [Sge<'a>], off: u64, flags: SendFlags) -> SendWr<'a> {
    SendWr::new(
        id,
        SendOp::Write {
            remote: p.b.mr.remote(off),
        },
        sge,
    )
    .flags(flags)
}

fn completions(out: &mut Vec<Case>) {
    out.push(Case::new(
        "comp.sq_sig_all",
        "on a QP created with sq_sig_all every send WR completes, SIGNALED or not",
        "ibv_create_qp(3) sq_sig_all; docs/design.md §3.4",
        &[],
        |env: &Env| {
            let p = pair(
                env,
                PairConfig {
                    sq_sig_all: true,
                    ..PairConfig::default()
                },
            )?;
            let sge = [p.a.mr.sge(0, 8)?];
            for id in 0..3 {
                p.a.post(write_wr(&p, id, &sge, id * 8, SendFlags::empty()))?;
            }
            let wcs = expect_n(&p.a.scq, 3, "completions of unsignaled WRs with sq_sig_all")?;
            for (i, wc) in wcs.iter().enumerate() {
                check_wc(wc, i as u64, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write")?;
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "comp.unsignaled_success_no_cqe",
        "successful unsignaled WRs produce no completion; a later signaled one produces exactly one, and implies they are done",
        "docs/design.md §3.4 (a signaled CQE implies every earlier unsignaled WR is done); ibv_post_send(3)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            for i in 0..5u64 {
                p.a.mr.write(i * 64, &pattern(64, i as u8))?;
            }
            let sgl: Vec<Sge<'_>> = (0..6).map(|i| p.a.mr.sge(i * 64, 64)).collect::<Result<_>>()?;
            for i in 0..5u64 {
                p.a.post(write_wr(&p, i, &sgl[i as usize..i as usize + 1], i * 64, SendFlags::empty()))?;
            }
            p.a.post(write_wr(&p, 5, &sgl[5..6], 5 * 64, SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "the signaled WR")?;
            check_wc(&wc, 5, WcStatus::Success, Some(WcOpcode::RdmaWrite), "the only completion")?;
            for i in 0..5u64 {
                ensure_eq!(p.b.mr.to_vec(i * 64, 64)?, pattern(64, i as u8), "data of unsignaled write {i}");
            }
            expect_quiet(&p.a.scq, "after the signaled completion")
        },
    ));
    out.push(Case::new(
        "comp.unsignaled_error_completes",
        "an unsignaled WR that fails still completes, with its error status",
        "docs/design.md §3.4 (on error a WR always completes)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 8)?];
            let bad = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(SendWr::new(3, SendOp::Write { remote: bad }, &sge))?;
            let wc = expect_one(&p.a.scq, "completion of the failing unsignaled WR")?;
            check_wc(&wc, 3, WcStatus::RemAccessErr, None, "unsignaled failing write")
        },
    ));
    out.push(Case::new(
        "comp.error_fields",
        "an error completion carries the wr_id, the status and the QP number",
        "docs/design.md §3.4 (error CQEs carry wr_id, status, qp_num, vendor_err); ibv_poll_cq(3)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 8)?];
            let bad = RemoteAddr {
                rkey: p.b.mr.rkey() ^ 0xff,
                ..p.b.mr.remote(0)
            };
            p.a.post(SendWr::new(0xabcd_ef01_2345, SendOp::Write { remote: bad }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "error completion")?;
            check_wc(&wc, 0xabcd_ef01_2345, WcStatus::RemAccessErr, None, "error completion")?;
            ensure_eq!(wc.qp_num, p.a.qp.qp_num(), "qp_num");
            Ok(())
        },
    ));
    out.push(Case::new(
        "comp.exactly_once",
        "60 WRs (every third signaled) and 20 sends with receives: each signaled WR and each receive completes exactly once, in order",
        "docs/design.md §3.4 (exactly once; CQEs per queue are FIFO)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig { cap: QpCap { max_send_wr: 128, max_recv_wr: 64, ..PairConfig::default().cap }, ..PairConfig::default() })?;
            let sge = [p.a.mr.sge(0, 16)?];
            let recv: Vec<Sge<'_>> = (0..20).map(|i| p.b.mr.sge(i * 64, 64)).collect::<Result<_>>()?;
            let rwrs: Vec<RecvWr<'_>> = (0..20).map(|i| RecvWr::new(1000 + i as u64, &recv[i..i + 1])).collect();
            p.b.qp.post_recv(&rwrs)?;
            let mut wrs = Vec::new();
            let mut want_send = Vec::new();
            for i in 0..60u64 {
                let signaled = i % 3 == 2;
                let flags = if signaled { SendFlags::SIGNALED } else { SendFlags::empty() };
                let wr = match i % 3 {
                    0 => SendWr::new(i, SendOp::Send, &sge).flags(flags),
                    _ => write_wr(&p, i, &sge, 8192 + 16 * i, flags),
                };
                if signaled {
                    want_send.push(i);
                }
                wrs.push(wr);
            }
            for chunk in wrs.chunks(20) {
                p.a.qp.post_send(chunk)?;
            }
            let sends = expect_n(&p.a.scq, want_send.len(), "signaled completions")?;
            let ids: Vec<u64> = sends.iter().map(|w| w.wr_id).collect();
            ensure_eq!(ids, want_send, "signaled wr_ids in order");
            let recvs = expect_n(&p.b.rcq, 20, "receive completions")?;
            let ids: Vec<u64> = recvs.iter().map(|w| w.wr_id).collect();
            ensure_eq!(ids, (1000..1020).collect::<Vec<_>>(), "receive wr_ids in order");
            ensure!(sends.iter().chain(&recvs).all(WorkCompletion::is_success), "a completion failed");
            expect_quiet(&p.a.scq, "send CQ after all completions")?;
            expect_quiet(&p.b.rcq, "receive CQ after all completions")
        },
    ));
}

/// Posts, on A: receives 10, 11, 12; then a send whose SGE is from another
/// PD (fails LOC_PROT_ERR), a signaled write, an unsignaled write and a
/// signaled send.
fn error_then_flush(p: &Pair) -> Check {
    let other = p.a.ctx.alloc_pd()?;
    let foreign = other.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
    for i in 0..3u64 {
        p.a.post_recv(10 + i, 4096 + 64 * i, 64)?;
    }
    let bad = [foreign.sge(0, 8)?];
    let ok = [p.a.mr.sge(0, 8)?];
    p.a.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &bad).flags(SendFlags::SIGNALED),
        write_wr(p, 2, &ok, 0, SendFlags::SIGNALED),
        write_wr(p, 3, &ok, 8, SendFlags::empty()),
        SendWr::new(4, SendOp::Send, &ok).flags(SendFlags::SIGNALED),
    ])?;
    Ok(())
}

fn check_flush_sends(wcs: &[WorkCompletion]) -> Check {
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let want = vec![
        (1, WcStatus::LocProtErr),
        (2, WcStatus::WrFlushErr),
        (3, WcStatus::WrFlushErr),
        (4, WcStatus::WrFlushErr),
    ];
    ensure_eq!(
        got,
        want,
        "send completions (error, then flushes in post order, unsignaled included)"
    );
    Ok(())
}

fn check_flush_recvs(wcs: &[WorkCompletion]) -> Check {
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<(u64, WcStatus)> = (10..13).map(|i| (i, WcStatus::WrFlushErr)).collect();
    ensure_eq!(got, want, "receive completions (flushes in post order)");
    Ok(())
}

fn flushes(out: &mut Vec<Case>) {
    out.push(Case::new(
        "comp.flush.after_error_post_order",
        "after an error CQE the QP is in ERR and every later send and every receive flushes with WR_FLUSH_ERR in post order",
        "docs/design.md §3.4 (after an error CQE everything outstanding and later flushes, in post order)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            error_then_flush(&p)?;
            let sends = expect_n(&p.a.scq, 4, "send completions")?;
            check_flush_sends(&sends)?;
            let recvs = expect_n(&p.a.rcq, 3, "receive completions")?;
            check_flush_recvs(&recvs)?;
            expect_state(&p.a.qp, QpState::Err, "the requester after the error")?;
            expect_quiet(&p.a.scq, "send CQ after the flushes (exactly once)")?;
            // Posting afterwards still completes, with a flush.
            let ok = [p.a.mr.sge(0, 8)?];
            p.a.post(write_wr(&p, 5, &ok, 0, SendFlags::empty()))?;
            let wc = expect_one(&p.a.scq, "a WR posted in ERR")?;
            check_wc(&wc, 5, WcStatus::WrFlushErr, None, "a WR posted in ERR")
        },
    ));
    out.push(Case::new(
        "comp.flush.send_before_recv",
        "with one CQ for both queues, the send queue's error and flushes come before the receive queue's flushes",
        "docs/design.md §3.4 (flush: send queue in post order, then receive queue)",
        &[],
        |env: &Env| {
            let p = pair(
                env,
                PairConfig {
                    shared_cq: true,
                    ..PairConfig::default()
                },
            )?;
            error_then_flush(&p)?;
            let all = expect_n(&p.a.scq, 7, "completions")?;
            check_flush_sends(&all[..4])?;
            check_flush_recvs(&all[4..])
        },
    ));
    out.push(Case::new(
        "comp.flush.modify_to_err",
        "moving a QP to ERR flushes an outstanding send (held by RNR) and the posted receives, sends first, each in post order",
        "docs/design.md §3.4; IBTA 10.3.1 (Error state: outstanding WRs complete in error)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig { shared_cq: true, rnr_retry: 7, ..PairConfig::default() })?;
            for i in 0..2u64 {
                p.a.post_recv(10 + i, 4096 + 64 * i, 64)?;
            }
            // B has no receive: the send waits on RNR NAKs forever.
            let sge = [p.a.mr.sge(0, 8)?];
            p.a.qp.post_send(&[
                SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED),
                SendWr::new(2, SendOp::Send, &sge),
            ])?;
            expect_quiet(&p.a.scq, "sends held by RNR")?;
            p.a.move_to(QpState::Err)?;
            let all = expect_n(&p.a.scq, 4, "flushes")?;
            let got: Vec<(u64, WcStatus)> = all.iter().map(|w| (w.wr_id, w.status)).collect();
            let want = vec![
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::WrFlushErr),
                (10, WcStatus::WrFlushErr),
                (11, WcStatus::WrFlushErr),
            ];
            ensure_eq!(got, want, "flush completions");
            ensure_eq!(all[0].qp_num, p.a.qp.qp_num(), "qp_num of a flush");
            Ok(())
        },
    ));
    out.push(Case::new(
        "comp.flush.in_flight_after_remote_error",
        "of four writes in flight, a good one completes, the second (bad rkey) fails REM_ACCESS_ERR, the last two flush, in order",
        "docs/design.md §3.4 (exactly once; error then flushes in post order)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let sge = [p.a.mr.sge(0, 64)?];
            let bad = RemoteAddr { rkey: p.b.mr.rkey() ^ 0xff, ..p.b.mr.remote(0) };
            let s = SendFlags::SIGNALED;
            p.a.qp.post_send(&[
                write_wr(&p, 0, &sge, 0, s),
                SendWr::new(1, SendOp::Write { remote: bad }, &sge).flags(s),
                write_wr(&p, 2, &sge, 128, s),
                write_wr(&p, 3, &sge, 256, SendFlags::empty()),
            ])?;
            let wcs = expect_n(&p.a.scq, 4, "completions")?;
            let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
            let want = vec![
                (0, WcStatus::Success),
                (1, WcStatus::RemAccessErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr),
            ];
            ensure_eq!(got, want, "completions");
            expect_quiet(&p.a.scq, "after the four completions")
        },
    ));
    out.push(Case::new(
        "comp.flush.reset_discards",
        "moving a QP to RESET discards posted receives without completions",
        "IBTA 10.3.1 (Reset: queues emptied, no completions)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            p.b.post_recv(1, 0, 64)?;
            p.b.move_to(QpState::Reset)?;
            expect_quiet(&p.b.rcq, "after RTS->RESET")
        },
    ));
}

fn ordering(out: &mut Vec<Case>) {
    out.push(Case::new(
        "order.rc.write_last_byte_lands_last",
        "while a 64 KiB write lands, a reader that sees the last byte sees the whole buffer",
        "docs/design.md §3.5 (writes land in order: perftest polls the last byte)",
        &[],
        |env: &Env| {
            let p = pair(
                env,
                PairConfig {
                    mtu: Mtu::Mtu1024,
                    mr_len: 1 << 17,
                    ..PairConfig::default()
                },
            )?;
            let len = 64 * 1024;
            let mut data = pattern(len, 50);
            data[len - 1] = 0xa5;
            p.a.mr.write(0, &data)?;
            p.b.mr.fill(0, len, 0)?;
            let sge = [p.a.mr.sge(0, len as u32)?];
            let stop = AtomicBool::new(false);
            let seen = std::thread::scope(|s| -> R<Vec<u8>> {
                let watcher = s.spawn(|| -> R<Option<Vec<u8>>> {
                    let start = Instant::now();
                    let mut last = [0u8];
                    while start.elapsed() < WAIT && !stop.load(Ordering::Acquire) {
                        p.b.mr.read(len as u64 - 1, &mut last)?;
                        if last[0] == 0xa5 {
                            return Ok(Some(p.b.mr.to_vec(0, len)?));
                        }
                        std::hint::spin_loop();
                    }
                    Ok(None)
                });
                let posted = p.a.post(write_wr(&p, 1, &sge, 0, SendFlags::SIGNALED));
                let done = posted.map_err(Stop::from).and_then(|()| {
                    let wc = expect_one(&p.a.scq, "write completion")?;
                    check_wc(&wc, 1, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write")
                });
                if done.is_err() {
                    stop.store(true, Ordering::Release);
                }
                let seen = watcher
                    .join()
                    .map_err(|_| Stop::Fail("the watcher panicked".into()))??;
                done?;
                match seen {
                    Some(v) => Ok(v),
                    None => fail!("the last byte never landed"),
                }
            })?;
            let first_bad = seen.iter().zip(&data).position(|(a, b)| a != b);
            if let Some(i) = first_bad {
                fail!("the last byte landed before byte {i} (of {len})");
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "order.rc.write_then_send_visible",
        "when the receive of a send completes, an RDMA write posted before the send is visible",
        "docs/design.md §3.5 (RC delivers in order); IBTA 9.5",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let data = pattern(2000, 51);
            p.a.mr.write(0, &data)?;
            p.b.post_recv(1, 0, 64)?;
            let w = [p.a.mr.sge(0, 2000)?];
            let s = [p.a.mr.sge(0, 4)?];
            p.a.qp.post_send(&[
                write_wr(&p, 1, &w, 8192, SendFlags::empty()),
                SendWr::new(2, SendOp::Send, &s).flags(SendFlags::SIGNALED),
            ])?;
            expect_one(&p.b.rcq, "receive of the send")?;
            ensure_eq!(
                p.b.mr.to_vec(8192, 2000)?,
                data,
                "data of the earlier write at receive time"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "order.rc.fence_after_read",
        "a FENCE'd write whose source is the destination of an earlier read carries the data the read brought",
        "docs/design.md §3.5 (IBV_SEND_FENCE holds a WR until earlier reads and atomics complete)",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            let remote_data = pattern(4096, 52);
            p.b.mr.write(0, &remote_data)?;
            p.a.mr.fill(0, 4096, 0x11)?;
            let local = [p.a.mr.sge(0, 4096)?];
            p.a.qp.post_send(&[
                SendWr::new(
                    1,
                    SendOp::Read {
                        remote: p.b.mr.remote(0),
                    },
                    &local,
                )
                .flags(SendFlags::SIGNALED),
                write_wr(&p, 2, &local, 8192, SendFlags::SIGNALED | SendFlags::FENCE),
            ])?;
            let wcs = expect_n(&p.a.scq, 2, "completions")?;
            check_wc(&wcs[0], 1, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
            check_wc(&wcs[1], 2, WcStatus::Success, Some(WcOpcode::RdmaWrite), "fenced write")?;
            ensure!(
                p.b.mr.to_vec(8192, 4096)? == remote_data,
                "the fenced write carried the buffer's old contents: it did not wait for the read"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "order.rc.fence_after_atomic",
        "a FENCE'd write whose source is an earlier fetch-and-add's result buffer carries the fetched value",
        "docs/design.md §3.5 (FENCE waits for earlier atomics)",
        &[crate::case::Cap::Atomics],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            p.b.mr.store_u64(0, 100)?;
            p.a.mr.store_u64(0, 7)?;
            let local = [p.a.mr.sge(0, 8)?];
            p.a.qp.post_send(&[
                SendWr::new(
                    1,
                    SendOp::FetchAdd {
                        remote: p.b.mr.remote(0),
                        add: 1,
                    },
                    &local,
                )
                .flags(SendFlags::SIGNALED),
                write_wr(&p, 2, &local, 64, SendFlags::SIGNALED | SendFlags::FENCE),
            ])?;
            expect_n(&p.a.scq, 2, "completions")?;
            ensure_eq!(p.a.mr.load_u64(0)?, 100, "value returned by the FAA");
            ensure_eq!(p.b.mr.load_u64(64)?, 100, "value carried by the fenced write");
            ensure_eq!(p.b.mr.load_u64(0)?, 101, "remote word after the FAA");
            Ok(())
        },
    ));
    out.push(Case::new(
        "order.rc.completions_fifo_across_opcodes",
        "completions of a read, a write, an atomic and a send come out in post order",
        "docs/design.md §3.4 (CQEs per queue are FIFO); IBTA 10.8.3",
        &[],
        |env: &Env| {
            let p = pair(env, PairConfig::default())?;
            p.b.post_recv(9, 0, 64)?;
            let big = [p.a.mr.sge(0, 16 * 1024)?];
            let small = [p.a.mr.sge(32 * 1024, 8)?];
            let s = SendFlags::SIGNALED;
            let mut wrs = vec![
                SendWr::new(
                    1,
                    SendOp::Read {
                        remote: p.b.mr.remote(16 * 1024),
                    },
                    &big,
                )
                .flags(s),
                write_wr(&p, 2, &small, 8, s),
            ];
            let atomics = env.caps.has(crate::case::Cap::Atomics);
            if atomics {
                wrs.push(
                    SendWr::new(
                        3,
                        SendOp::FetchAdd {
                            remote: p.b.mr.remote(64),
                            add: 1,
                        },
                        &small,
                    )
                    .flags(s),
                );
            }
            wrs.push(SendWr::new(4, SendOp::Send, &small).flags(s));
            p.a.qp.post_send(&wrs)?;
            let wcs = expect_n(&p.a.scq, wrs.len(), "completions")?;
            let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
            let want: Vec<u64> = wrs.iter().map(|w| w.wr_id).collect();
            ensure_eq!(ids, want, "completion order");
            Ok(())
        },
    ));
}
