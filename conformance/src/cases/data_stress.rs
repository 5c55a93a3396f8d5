//! More `data.*` cases: PSN wraparound, reads and atomics serialized by
//! `max_rd_atomic`, a deterministic mixed sequence checked against a model,
//! loopback to the same QP and the same device, inline gathers.

use softverbs::verbs::*;

use super::data::{req, tn, Conn, WRITE_OFF};
use crate::case::{Cap, Case, Check, Env};
use crate::harness::*;
use crate::{ensure, ensure_eq};

pub(crate) fn register(out: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc] {
        out.push(Case::new(
            format!("data.{}.psn_wraparound", tn(t)),
            format!("{t} messages of many packets whose PSNs cross 0xffffff -> 0 arrive intact, in order"),
            "IBTA 9.7.1 (PSNs are 24-bit and wrap); docs/design.md §3.2 (PSNs are 24 bits)",
            req(t),
            move |env: &Env| {
                let cfg = PairConfig {
                    qp_type: t,
                    mtu: Mtu::Mtu256,
                    psn: 0xff_fff8,
                    ..PairConfig::default()
                };
                let c = Conn::with(env, cfg)?;
                let p = &c.p;
                for k in 0..4u64 {
                    let len = 2000 + 37 * k as usize;
                    let data = pattern(len, 60 + k as u8);
                    p.a.mr.write(0, &data)?;
                    p.b.post_recv(k, 0, 4096)?;
                    let sge = [p.a.mr.sge(0, len as u32)?];
                    p.a.post(c.wr(k, SendOp::Send, &sge, SendFlags::SIGNALED))?;
                    let s = expect_one(&p.a.scq, "send completion")?;
                    check_wc(&s, k, WcStatus::Success, Some(WcOpcode::Send), "send")?;
                    let r = expect_one(&p.b.rcq, "receive")?;
                    check_wc(&r, k, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                    ensure!(p.b.mr.to_vec(0, len)? == data, "message {k}: data differs");
                    let remote = p.b.mr.remote(WRITE_OFF);
                    p.a.post(c.wr(100 + k, SendOp::Write { remote }, &sge, SendFlags::SIGNALED))?;
                    expect_one(&p.a.scq, "write completion")?;
                    ensure!(p.b.mr.to_vec(WRITE_OFF, len)? == data, "write {k}: data differs");
                    if t == QpType::Rc {
                        let back = [p.a.mr.sge(8192, len as u32)?];
                        p.a.post(c.wr(200 + k, SendOp::Read { remote }, &back, SendFlags::SIGNALED))?;
                        expect_one(&p.a.scq, "read completion")?;
                        ensure!(p.a.mr.to_vec(8192, len)? == data, "read {k}: data differs");
                    }
                }
                Ok(())
            },
        ));
    }
    out.push(Case::new(
        "data.rc.read.serialized_by_max_rd_atomic_1",
        "with max_rd_atomic 1, eight reads and eight fetch-and-adds posted at once all complete, in order, with the right data",
        "IBTA 9.4.3 (outstanding reads bounded by max_rd_atomic); docs/design.md §3.7",
        &[Cap::Atomics],
        |env: &Env| {
            let c = Conn::with(env, PairConfig { rd_atomic: 1, mtu: Mtu::Mtu256, ..PairConfig::default() })?;
            let p = &c.p;
            for i in 0..8u64 {
                p.b.mr.write(i * 1024, &pattern(700, 70 + i as u8))?;
            }
            let reads: Vec<Sge<'_>> = (0..8).map(|i| p.a.mr.sge(i * 1024, 700)).collect::<Result<_>>()?;
            let faa: Vec<Sge<'_>> = (0..8).map(|i| p.a.mr.sge(16384 + i * 8, 8)).collect::<Result<_>>()?;
            let mut wrs = Vec::new();
            for i in 0..8usize {
                let remote = p.b.mr.remote(i as u64 * 1024);
                wrs.push(c.wr(2 * i as u64, SendOp::Read { remote }, &reads[i..i + 1], SendFlags::SIGNALED));
                let counter = p.b.mr.remote(WRITE_OFF);
                let op = SendOp::FetchAdd { remote: counter, add: 1 };
                wrs.push(c.wr(2 * i as u64 + 1, op, &faa[i..i + 1], SendFlags::SIGNALED));
            }
            p.a.qp.post_send(&wrs)?;
            let wcs = expect_n(&p.a.scq, 16, "completions")?;
            for (i, wc) in wcs.iter().enumerate() {
                check_wc(wc, i as u64, WcStatus::Success, None, "read/atomic")?;
            }
            for i in 0..8u64 {
                let got = p.a.mr.to_vec(i * 1024, 700)?;
                ensure!(got == pattern(700, 70 + i as u8), "read {i}: data differs");
                ensure_eq!(p.a.mr.load_u64(16384 + i * 8)?, i, "FAA {i} returned");
            }
            ensure_eq!(p.b.mr.load_u64(WRITE_OFF)?, 8, "counter after 8 FAAs");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.mixed_sequence",
        "a deterministic mix of 48 sends, writes, write-imms, reads and atomics keeps every byte and completion in order",
        "IBTA 9.5 (RC ordering); docs/design.md §3.4, §3.5",
        &[Cap::Atomics],
        mixed_sequence,
    ));
    out.push(Case::new(
        "data.rc.self_loopback",
        "an RC QP connected to itself sends to its own receive queue and writes to its own memory",
        "IBTA 9.6.1 (a QP may be connected to any QP, itself included)",
        &[],
        |env: &Env| {
            let cfg = PairConfig::default();
            let p = Pair::unconnected(&env.a, &env.b, cfg.clone())?;
            let a = &p.a;
            qp_to_init(&a.qp, &cfg)?;
            qp_to_rtr(&a.qp, &cfg, a.gid_index, a.gid, a.qp.qp_num(), a.psn)?;
            qp_to_rts(&a.qp, &cfg, a.psn)?;
            a.mr.write(0, b"to myself")?;
            a.post_recv(1, 4096, 64)?;
            let sge = [a.mr.sge(0, 9)?];
            a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            a.post(
                SendWr::new(
                    3,
                    SendOp::Write {
                        remote: a.mr.remote(8192),
                    },
                    &sge,
                )
                .flags(SendFlags::SIGNALED),
            )?;
            let s = expect_n(&a.scq, 2, "send completions")?;
            check_wc(&s[0], 2, WcStatus::Success, Some(WcOpcode::Send), "send to self")?;
            check_wc(&s[1], 3, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write to self")?;
            let r = expect_one(&a.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive from self")?;
            ensure_eq!(a.mr.to_vec(4096, 9)?, b"to myself".to_vec(), "received data");
            ensure_eq!(a.mr.to_vec(8192, 9)?, b"to myself".to_vec(), "written data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.same_device_pair",
        "two RC QPs on one device (both sides on side A's context) exchange a send, a write and a read",
        "IBTA 9.6.1 (loopback through the port)",
        &[],
        |env: &Env| {
            let p = Pair::new(&env.a, &env.a, PairConfig::default())?;
            p.a.mr.write(0, b"same device")?;
            p.b.post_recv(1, 0, 64)?;
            let sge = [p.a.mr.sge(0, 11)?];
            p.a.post(SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            expect_one(&p.a.scq, "send completion")?;
            p.a.post(
                SendWr::new(
                    3,
                    SendOp::Write {
                        remote: p.b.mr.remote(4096),
                    },
                    &sge,
                )
                .flags(SendFlags::SIGNALED),
            )?;
            expect_one(&p.a.scq, "write completion")?;
            let back = [p.a.mr.sge(8192, 11)?];
            p.a.post(
                SendWr::new(
                    4,
                    SendOp::Read {
                        remote: p.b.mr.remote(4096),
                    },
                    &back,
                )
                .flags(SendFlags::SIGNALED),
            )?;
            let s = expect_one(&p.a.scq, "read completion")?;
            check_wc(&s, 4, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
            ensure_eq!(p.a.mr.to_vec(8192, 11)?, b"same device".to_vec(), "data read back");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.send.inline_multi_sge",
        "an INLINE send gathered from three plain buffers arrives as one message",
        "ibv_post_send(3) (IBV_SEND_INLINE with several SGEs)",
        &[Cap::Inline],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let (x, y, z) = (b"one-".to_vec(), b"two-".to_vec(), b"three".to_vec());
            p.b.post_recv(1, 0, 64)?;
            let sgl = [Sge::inline(&x), Sge::inline(&y), Sge::inline(&z)];
            p.a.post(c.wr(2, SendOp::Send, &sgl, SendFlags::SIGNALED | SendFlags::INLINE))?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(p.b.mr.to_vec(0, 13)?, b"one-two-three".to_vec(), "received data");
            expect_one(&p.a.scq, "send completion")?;
            Ok(())
        },
    ));
}

/// 48 operations chosen by a fixed generator; checks every completion and
/// the final memory against a model.
fn mixed_sequence(env: &Env) -> Check {
    let c = Conn::with(
        env,
        PairConfig {
            mtu: Mtu::Mtu512,
            mr_len: 1 << 17,
            ..PairConfig::default()
        },
    )?;
    let p = &c.p;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // B's memory: writes land in 0..32 KiB (modelled), sends at 64 KiB, the
    // fetch-and-add counter at 100 KiB. A's: data at 0, reads at 8 KiB,
    // fetched values at 12 KiB.
    let area = 32 * 1024usize;
    let mut model = vec![0u8; area];
    p.b.mr.fill(0, area, 0)?;
    let mut counter = 0u64;
    for i in 0..48u64 {
        let kind = next() % 5;
        let len = 1 + (next() % 3000) as usize;
        let off = (next() as usize % (area - len - 8)) & !7;
        let data = pattern(len, i as u8);
        p.a.mr.write(0, &data)?;
        let sge = [p.a.mr.sge(0, len as u32)?];
        let remote = p.b.mr.remote(off as u64);
        match kind {
            0 => {
                p.b.post_recv(i, 65536, 4096)?;
                p.a.post(c.wr(i, SendOp::Send, &sge, SendFlags::SIGNALED))?;
                let r = expect_one(&p.b.rcq, "receive")?;
                check_wc(&r, i, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                ensure!(p.b.mr.to_vec(65536, len)? == data, "op {i}: received data differs");
            }
            1 | 2 => {
                let imm = kind == 2;
                if imm {
                    p.b.post_recv(i, 65536, 16)?;
                }
                let op = match imm {
                    true => SendOp::WriteWithImm { remote, imm: i as u32 },
                    false => SendOp::Write { remote },
                };
                p.a.post(c.wr(i, op, &sge, SendFlags::SIGNALED))?;
                model[off..off + len].copy_from_slice(&data);
                if imm {
                    let r = expect_one(&p.b.rcq, "receive of the write with immediate")?;
                    check_wc(&r, i, WcStatus::Success, Some(WcOpcode::RecvRdmaWithImm), "receive")?;
                    ensure_eq!(r.imm(), Some(i as u32), "op {i}: immediate");
                }
            }
            3 => {
                let back = [p.a.mr.sge(8192, len as u32)?];
                p.a.post(c.wr(i, SendOp::Read { remote }, &back, SendFlags::SIGNALED))?;
                let s = expect_one(&p.a.scq, "read completion")?;
                check_wc(&s, i, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
                ensure!(
                    p.a.mr.to_vec(8192, len)? == model[off..off + len],
                    "op {i}: read data differs from the model"
                );
                continue;
            }
            _ => {
                let res = [p.a.mr.sge(12288, 8)?];
                let op = SendOp::FetchAdd {
                    remote: p.b.mr.remote(100 * 1024),
                    add: 3,
                };
                p.a.post(c.wr(i, op, &res, SendFlags::SIGNALED))?;
                let s = expect_one(&p.a.scq, "atomic completion")?;
                check_wc(&s, i, WcStatus::Success, Some(WcOpcode::FetchAdd), "fetch-and-add")?;
                ensure_eq!(p.a.mr.load_u64(12288)?, counter, "op {i}: fetched value");
                counter += 3;
                continue;
            }
        }
        let s = expect_one(&p.a.scq, "completion")?;
        check_wc(&s, i, WcStatus::Success, None, "operation")?;
    }
    ensure!(
        p.b.mr.to_vec(0, area)? == model,
        "B's memory differs from the model at the end"
    );
    Ok(())
}
