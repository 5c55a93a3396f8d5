//! `data.*`: the data path: every opcode on every QP type where it is legal
//! (RC: send, send-imm, write, write-imm, read, CAS, FAA; UC: send,
//! send-imm, write, write-imm; UD: send and send-imm with GRH and Q_Key),
//! multi-SGE scatter/gather on both sides, inline data, immediate data,
//! messages of many MTUs, zero-length operations and atomic values.

use softverbs::verbs::*;

use crate::case::{Cap, Case, Check, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq};

type R<T> = std::result::Result<T, Stop>;

/// Length of the GRH that starts every UD receive buffer (docs/design.md §3.5).
pub(crate) const GRH: usize = 40;

/// Where B's receive buffers live in its MR; writes target 32 KiB up.
const RECV_OFF: u64 = 0;
pub(crate) const WRITE_OFF: u64 = 32 * 1024;

pub(crate) fn req(t: QpType) -> &'static [Cap] {
    match t {
        QpType::Rc => &[],
        QpType::Uc => &[Cap::Uc],
        QpType::Ud => &[Cap::Ud],
    }
}

pub(crate) fn tn(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
    }
}

/// A connected pair of `t` with `mtu`, plus (UD) an address handle A→B.
pub(crate) struct Conn {
    pub(crate) p: Pair,
    pub(crate) ah: Option<Ah>,
}

impl Conn {
    pub(crate) fn new(env: &Env, t: QpType, mtu: Mtu) -> R<Conn> {
        Conn::with(
            env,
            PairConfig {
                qp_type: t,
                mtu,
                ..PairConfig::default()
            },
        )
    }

    pub(crate) fn with(env: &Env, cfg: PairConfig) -> R<Conn> {
        let t = cfg.qp_type;
        let p = Pair::new(&env.a, &env.b, cfg)?;
        let ah = match t {
            QpType::Ud => Some(p.a.ah_to(&p.b)?),
            _ => None,
        };
        Ok(Conn { p, ah })
    }

    fn t(&self) -> QpType {
        self.p.cfg.qp_type
    }

    /// A send WR from A, addressed to B when UD.
    pub(crate) fn wr<'a>(&'a self, id: u64, op: SendOp<'a>, sgl: &'a [Sge<'a>], flags: SendFlags) -> SendWr<'a> {
        let wr = SendWr::new(id, op, sgl).flags(flags);
        match &self.ah {
            Some(ah) => wr.ud(ah, self.p.b.qp.qp_num(), self.p.cfg.qkey),
            None => wr,
        }
    }

    /// Extra receive space for the GRH on UD.
    fn grh(&self) -> usize {
        if self.t() == QpType::Ud {
            GRH
        } else {
            0
        }
    }
}

pub(crate) fn register(out: &mut Vec<Case>) {
    opcodes(out);
    sgl_inline_imm(out);
    sizes(out);
    zero_length(out);
    atomics(out);
    super::data_stress::register(out);
}

fn opcodes(out: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        out.push(Case::new(
            format!("data.{}.send", tn(t)),
            format!("a {t} send of 100 bytes arrives intact with the right completion fields on both sides"),
            "IBTA 9.4.1 (send); ibv_poll_cq(3) (wc fields); docs/design.md §3.5 (UD: 40-byte GRH)",
            req(t),
            move |env: &Env| send_case(env, t, None, 100),
        ));
        out.push(Case::new(
            format!("data.{}.send_imm", tn(t)),
            format!("a {t} send with immediate delivers the data and the immediate value (host order) with WITH_IMM"),
            "IBTA 9.4.1 (send with immediate); docs/design.md §3.5 (immediate data)",
            req(t),
            move |env: &Env| send_case(env, t, Some(0x1234_5678), 100),
        ));
    }
    for t in [QpType::Rc, QpType::Uc] {
        out.push(Case::new(
            format!("data.{}.write", tn(t)),
            format!("a {t} RDMA write lands in remote memory and consumes no receive"),
            "IBTA 9.4.2 (RDMA write)",
            req(t),
            move |env: &Env| write_case(env, t, None, 300),
        ));
        out.push(Case::new(
            format!("data.{}.write_imm", tn(t)),
            format!(
                "a {t} RDMA write with immediate lands in memory and consumes a receive (RECV_RDMA_WITH_IMM, byte_len, imm)"
            ),
            "docs/design.md §3.5 (write-with-immediate consumes a receive WQE); IBTA 9.4.2",
            req(t),
            move |env: &Env| write_case(env, t, Some(0xfeed_f00d), 300),
        ));
    }
    out.push(Case::new(
        "data.rc.read",
        "an RC RDMA read brings remote data into the local buffer; the completion is RDMA_READ with byte_len",
        "IBTA 9.4.3 (RDMA read); ibv_poll_cq(3)",
        &[],
        |env: &Env| read_case(env, 300),
    ));
    out.push(Case::new(
        "data.rc.cas",
        "an RC compare-and-swap whose compare matches swaps the remote word and returns the original",
        "IBTA 9.4.5 (atomics)",
        &[Cap::Atomics],
        |env: &Env| atomic_case(env, true),
    ));
    out.push(Case::new(
        "data.rc.faa",
        "an RC fetch-and-add adds to the remote word and returns the original",
        "IBTA 9.4.5 (atomics)",
        &[Cap::Atomics],
        |env: &Env| atomic_case(env, false),
    ));
}

/// Sends `len` bytes from A (offset 0) to a receive at B and checks both
/// completions and the data.
fn send_case(env: &Env, t: QpType, imm: Option<u32>, len: usize) -> Check {
    let c = Conn::new(env, t, Mtu::Mtu1024)?;
    let p = &c.p;
    let data = pattern(len, 11);
    p.a.mr.write(0, &data)?;
    p.b.mr.fill(0, 4096, 0xee)?;
    p.b.post_recv(77, RECV_OFF, (c.grh() + len + 64) as u32)?;
    let sge = [p.a.mr.sge(0, len as u32)?];
    let op = match imm {
        Some(imm) => SendOp::SendWithImm { imm },
        None => SendOp::Send,
    };
    p.a.post(c.wr(5, op, &sge, SendFlags::SIGNALED))?;
    let s = expect_one(&p.a.scq, "send completion")?;
    check_wc(&s, 5, WcStatus::Success, Some(WcOpcode::Send), "send completion")?;
    ensure_eq!(s.qp_num, p.a.qp.qp_num(), "send completion qp_num");
    let r = expect_one(&p.b.rcq, "receive completion")?;
    check_wc(&r, 77, WcStatus::Success, Some(WcOpcode::Recv), "receive completion")?;
    ensure_eq!(r.qp_num, p.b.qp.qp_num(), "receive completion qp_num");
    ensure_eq!(r.byte_len as usize, c.grh() + len, "receive byte_len");
    ensure_eq!(r.imm(), imm, "receive immediate data");
    if t == QpType::Ud {
        ensure!(
            r.wc_flags.contains(WcFlags::GRH),
            "UD receive without the GRH flag: {:?}",
            r.wc_flags
        );
        ensure_eq!(r.src_qp, p.a.qp.qp_num(), "UD receive src_qp");
    }
    ensure_eq!(p.b.mr.to_vec(c.grh() as u64, len)?, data, "received data");
    let after = p.b.mr.to_vec((c.grh() + len) as u64, 64)?;
    ensure!(
        after.iter().all(|&b| b == 0xee),
        "bytes after the message were overwritten"
    );
    Ok(())
}

/// Writes `len` bytes to B at [`WRITE_OFF`] (with immediate if `imm`).
fn write_case(env: &Env, t: QpType, imm: Option<u32>, len: usize) -> Check {
    let c = Conn::new(env, t, Mtu::Mtu1024)?;
    let p = &c.p;
    let data = pattern(len, 12);
    p.a.mr.write(0, &data)?;
    p.b.mr.fill(WRITE_OFF, len + 64, 0xee)?;
    p.b.post_recv(66, RECV_OFF, 256)?;
    let sge = [p.a.mr.sge(0, len as u32)?];
    let remote = p.b.mr.remote(WRITE_OFF);
    let op = match imm {
        Some(imm) => SendOp::WriteWithImm { remote, imm },
        None => SendOp::Write { remote },
    };
    p.a.post(c.wr(6, op, &sge, SendFlags::SIGNALED))?;
    let s = expect_one(&p.a.scq, "write completion")?;
    check_wc(&s, 6, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write completion")?;
    match imm {
        Some(imm) => {
            let r = expect_one(&p.b.rcq, "receive consumed by the write with immediate")?;
            check_wc(
                &r,
                66,
                WcStatus::Success,
                Some(WcOpcode::RecvRdmaWithImm),
                "receive completion",
            )?;
            ensure_eq!(r.imm(), Some(imm), "immediate data");
            ensure_eq!(r.byte_len as usize, len, "byte_len of RECV_RDMA_WITH_IMM");
            ensure_eq!(r.qp_num, p.b.qp.qp_num(), "receive completion qp_num");
            ensure_eq!(
                p.b.mr.to_vec(RECV_OFF, 16)?,
                vec![0u8; 16],
                "the receive buffer (untouched)"
            );
        }
        None => {
            // A plain write leaves B's posted receive alone; a later send uses it.
            let one = [p.a.mr.sge(0, 4)?];
            p.a.post(c.wr(7, SendOp::Send, &one, SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "follow-up send")?;
            let r = expect_one(&p.b.rcq, "receive of the follow-up send")?;
            check_wc(
                &r,
                66,
                WcStatus::Success,
                Some(WcOpcode::Recv),
                "receive (not consumed by the write)",
            )?;
            ensure_eq!(r.byte_len, 4, "byte_len of the follow-up send");
        }
    }
    ensure_eq!(p.b.mr.to_vec(WRITE_OFF, len)?, data, "written data");
    let tail = p.b.mr.to_vec(WRITE_OFF + len as u64, 64)?;
    ensure!(tail.iter().all(|&b| b == 0xee), "bytes after the written range changed");
    Ok(())
}

fn read_case(env: &Env, len: usize) -> Check {
    let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
    let p = &c.p;
    let data = pattern(len, 13);
    p.b.mr.write(WRITE_OFF, &data)?;
    let sge = [p.a.mr.sge(1024, len as u32)?];
    p.a.post(c.wr(
        8,
        SendOp::Read {
            remote: p.b.mr.remote(WRITE_OFF),
        },
        &sge,
        SendFlags::SIGNALED,
    ))?;
    let s = expect_one(&p.a.scq, "read completion")?;
    check_wc(&s, 8, WcStatus::Success, Some(WcOpcode::RdmaRead), "read completion")?;
    ensure_eq!(s.byte_len as usize, len, "read byte_len");
    ensure_eq!(p.a.mr.to_vec(1024, len)?, data, "data read");
    Ok(())
}

fn atomic_case(env: &Env, cas: bool) -> Check {
    let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
    let p = &c.p;
    p.b.mr.store_u64(64, 10)?;
    p.a.mr.store_u64(8, 0xdead)?;
    let sge = [p.a.mr.sge(8, 8)?];
    let remote = p.b.mr.remote(64);
    let (op, opcode, want) = match cas {
        true => (
            SendOp::CompareSwap {
                remote,
                compare: 10,
                swap: 99,
            },
            WcOpcode::CompSwap,
            99,
        ),
        false => (SendOp::FetchAdd { remote, add: 5 }, WcOpcode::FetchAdd, 15),
    };
    p.a.post(c.wr(9, op, &sge, SendFlags::SIGNALED))?;
    let s = expect_one(&p.a.scq, "atomic completion")?;
    check_wc(&s, 9, WcStatus::Success, Some(opcode), "atomic completion")?;
    ensure_eq!(s.byte_len, 8, "atomic byte_len");
    ensure_eq!(p.a.mr.load_u64(8)?, 10, "original value returned to the requester");
    ensure_eq!(p.b.mr.load_u64(64)?, want, "remote word after the atomic");
    Ok(())
}

fn sgl_inline_imm(out: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc] {
        out.push(Case::new(
            format!("data.{}.send.multi_sge", tn(t)),
            format!("a {t} send gathered from 3 SGEs scatters into a receive of 3 differently split SGEs"),
            "IBTA 9.4.1; ibv_post_send(3)/ibv_post_recv(3) (sg_list)",
            req(t),
            move |env: &Env| multi_sge_send(env, t),
        ));
    }
    out.push(Case::new(
        "data.ud.send.grh_sge_split",
        "a UD receive of two SGEs (40 bytes, then the payload buffer) gets the GRH in the first and the data in the second",
        "docs/design.md §3.5 (UD receive buffers start with a 40-byte GRH); IBTA 11.4.1.2",
        &[Cap::Ud],
        |env: &Env| {
            let c = Conn::new(env, QpType::Ud, Mtu::Mtu1024)?;
            let p = &c.p;
            let data = pattern(200, 14);
            p.a.mr.write(0, &data)?;
            let rsge = [p.b.mr.sge(0, GRH as u32)?, p.b.mr.sge(4096, 1024)?];
            p.b.qp.post_recv(&[RecvWr::new(1, &rsge)])?;
            let sge = [p.a.mr.sge(0, 200)?];
            p.a.post(c.wr(2, SendOp::Send, &sge, SendFlags::SIGNALED))?;
            let r = expect_one(&p.b.rcq, "UD receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "UD receive")?;
            ensure_eq!(r.byte_len as usize, GRH + 200, "byte_len");
            ensure_eq!(p.b.mr.to_vec(4096, 200)?, data, "payload in the second SGE");
            expect_one(&p.a.scq, "send completion")?;
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.write.multi_sge",
        "an RDMA write gathered from 3 local SGEs lands contiguously at the remote address",
        "IBTA 9.4.2; ibv_post_send(3) (sg_list)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu256)?;
            let p = &c.p;
            let parts = [(0u64, 100u32), (5000, 1), (9000, 700)];
            let mut want = Vec::new();
            for (i, &(off, len)) in parts.iter().enumerate() {
                let d = pattern(len as usize, 20 + i as u8);
                p.a.mr.write(off, &d)?;
                want.extend(d);
            }
            let sgl: Vec<Sge<'_>> = parts.iter().map(|&(o, l)| p.a.mr.sge(o, l)).collect::<Result<_>>()?;
            let op = SendOp::Write {
                remote: p.b.mr.remote(WRITE_OFF),
            };
            p.a.post(c.wr(3, op, &sgl, SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "write completion")?;
            check_wc(&s, 3, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write")?;
            ensure_eq!(p.b.mr.to_vec(WRITE_OFF, want.len())?, want, "gathered data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.read.multi_sge",
        "an RDMA read scatters the remote range into 3 local SGEs in order",
        "IBTA 9.4.3; ibv_post_send(3) (sg_list)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu256)?;
            let p = &c.p;
            let data = pattern(801, 15);
            p.b.mr.write(WRITE_OFF, &data)?;
            let parts = [(0u64, 100u32), (5000, 1), (9000, 700)];
            let sgl: Vec<Sge<'_>> = parts.iter().map(|&(o, l)| p.a.mr.sge(o, l)).collect::<Result<_>>()?;
            let op = SendOp::Read {
                remote: p.b.mr.remote(WRITE_OFF),
            };
            p.a.post(c.wr(4, op, &sgl, SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "read completion")?;
            check_wc(&s, 4, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
            let mut got = Vec::new();
            for &(o, l) in &parts {
                got.extend(p.a.mr.to_vec(o, l as usize)?);
            }
            ensure_eq!(got, data, "scattered data");
            Ok(())
        },
    ));
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        out.push(Case::new(
            format!("data.{}.send.inline", tn(t)),
            format!("an INLINE {t} send from a plain buffer arrives intact; the buffer is reusable when post returns"),
            "docs/design.md §3.3 (inline: the buffer is reusable when post returns); ibv_post_send(3) IBV_SEND_INLINE",
            &[req(t), &[Cap::Inline]].concat(),
            move |env: &Env| inline_send(env, t),
        ));
    }
    out.push(Case::new(
        "data.rc.write.inline",
        "an INLINE RDMA write from a plain buffer lands intact",
        "docs/design.md §3.3 (inline: send and RDMA write)",
        &[Cap::Inline],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let mut buf = pattern(48, 16);
            let want = buf.clone();
            {
                let sge = [Sge::inline(&buf)];
                let op = SendOp::Write {
                    remote: p.b.mr.remote(WRITE_OFF),
                };
                p.a.post(c.wr(5, op, &sge, SendFlags::SIGNALED | SendFlags::INLINE))?;
            }
            buf.fill(0);
            let s = expect_one(&p.a.scq, "inline write completion")?;
            check_wc(&s, 5, WcStatus::Success, Some(WcOpcode::RdmaWrite), "inline write")?;
            ensure_eq!(p.b.mr.to_vec(WRITE_OFF, 48)?, want, "written data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.send.inline_from_mr_sge",
        "an INLINE send whose SGE names registered memory copies it at post time",
        "ibv_post_send(3) (IBV_SEND_INLINE: the lkey is not checked, the data is copied)",
        &[Cap::Inline],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.a.mr.write(0, b"inline from an MR")?;
            p.b.post_recv(1, 0, 256)?;
            let sge = [p.a.mr.sge(0, 17)?];
            p.a.post(c.wr(2, SendOp::Send, &sge, SendFlags::SIGNALED | SendFlags::INLINE))?;
            p.a.mr.write(0, b"XXXXXXXXXXXXXXXXX")?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            expect_one(&p.a.scq, "send completion")?;
            ensure_eq!(p.b.mr.to_vec(0, 17)?, b"inline from an MR".to_vec(), "received data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.imm.values",
        "immediate values 0, 1, 0x80000000, 0xdeadbeef and 0xffffffff arrive unchanged (host order) by send and write",
        "docs/design.md §3.5 (immediate data is big-endian on the wire; the CQE holds the host value)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let sge = [p.a.mr.sge(0, 8)?];
            let values = [0u32, 1, 0x8000_0000, 0xdead_beef, u32::MAX];
            for (i, &imm) in values.iter().enumerate() {
                for write in [false, true] {
                    let id = (i * 2 + usize::from(write)) as u64;
                    p.b.post_recv(id, 0, 64)?;
                    let op = match write {
                        false => SendOp::SendWithImm { imm },
                        true => SendOp::WriteWithImm {
                            remote: p.b.mr.remote(WRITE_OFF),
                            imm,
                        },
                    };
                    p.a.post(c.wr(id, op, &sge, SendFlags::SIGNALED))?;
                    expect_one(&p.a.scq, "send completion")?;
                    let r = expect_one(&p.b.rcq, "receive completion")?;
                    ensure_eq!(r.imm(), Some(imm), "immediate data (write: {write})");
                }
            }
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.ud.send.qkey_high_bit_uses_qp_qkey",
        "a UD send whose remote_qkey has the high bit set uses the sending QP's own Q_Key (and so is received)",
        "IBTA 10.2.5 (a Q_Key with the high-order bit set in the WR selects the QP's Q_Key); ibv_post_send(3)",
        &[Cap::Ud],
        |env: &Env| {
            let c = Conn::new(env, QpType::Ud, Mtu::Mtu1024)?;
            let p = &c.p;
            let ah = c.ah.as_ref().expect("UD pair has an AH");
            p.b.post_recv(1, 0, 1024)?;
            let sge = [p.a.mr.sge(0, 16)?];
            let wr = SendWr::new(2, SendOp::Send, &sge)
                .flags(SendFlags::SIGNALED)
                .ud(ah, p.b.qp.qp_num(), 0x8000_0000);
            p.a.post(wr)?;
            expect_one(&p.a.scq, "send completion")?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")
        },
    ));
    out.push(Case::new(
        "data.rc.send.zero_length_sge_in_list",
        "a send whose SGE list has a zero-length entry in the middle delivers the other entries contiguously",
        "ibv_post_send(3) (sg_list entries may have length 0)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.a.mr.write(0, b"head")?;
            p.a.mr.write(100, b"tail")?;
            let sgl = [p.a.mr.sge(0, 4)?, p.a.mr.sge(50, 0)?, p.a.mr.sge(100, 4)?];
            p.b.post_recv(1, 0, 64)?;
            p.a.post(c.wr(2, SendOp::Send, &sgl, SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "send completion")?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(r.byte_len, 8, "byte_len");
            ensure_eq!(p.b.mr.to_vec(0, 8)?, b"headtail".to_vec(), "received data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.send.recv_buffer_larger",
        "a send into a larger receive buffer reports the message length as byte_len",
        "ibv_poll_cq(3) (byte_len: bytes transferred)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.b.post_recv(1, 0, 8192)?;
            let sge = [p.a.mr.sge(0, 33)?];
            p.a.post(c.wr(2, SendOp::Send, &sge, SendFlags::SIGNALED))?;
            let r = expect_one(&p.b.rcq, "receive")?;
            ensure_eq!(r.byte_len, 33, "byte_len");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.send.many_in_order",
        "64 back-to-back sends land in 64 receives in post order",
        "IBTA 9.5 (RC delivers in order); docs/design.md §3.5",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let recvs: Vec<Sge<'_>> = (0..64).map(|i| p.b.mr.sge(i * 64, 64)).collect::<Result<_>>()?;
            let rwrs: Vec<RecvWr<'_>> = recvs
                .iter()
                .enumerate()
                .map(|(i, s)| RecvWr::new(i as u64, std::slice::from_ref(s)))
                .collect();
            p.b.qp.post_recv(&rwrs)?;
            for i in 0..64u64 {
                p.a.mr.write(i * 8, &i.to_le_bytes())?;
            }
            let sends: Vec<Sge<'_>> = (0..64).map(|i| p.a.mr.sge(i * 8, 8)).collect::<Result<_>>()?;
            let swrs: Vec<SendWr<'_>> = sends
                .iter()
                .enumerate()
                .map(|(i, s)| c.wr(i as u64, SendOp::Send, std::slice::from_ref(s), SendFlags::SIGNALED))
                .collect();
            p.a.qp.post_send(&swrs)?;
            let rs = expect_n(&p.b.rcq, 64, "receives")?;
            for (i, r) in rs.iter().enumerate() {
                check_wc(r, i as u64, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                let got = u64::from_le_bytes(p.b.mr.to_vec(i as u64 * 64, 8)?.try_into().expect("8 bytes"));
                ensure_eq!(got, i as u64, "message in receive {i}");
            }
            expect_n(&p.a.scq, 64, "send completions")?;
            Ok(())
        },
    ));
}

fn multi_sge_send(env: &Env, t: QpType) -> Check {
    let c = Conn::new(env, t, Mtu::Mtu256)?;
    let p = &c.p;
    let parts = [(0u64, 100u32), (3000, 1), (6000, 300)];
    let mut want = Vec::new();
    for (i, &(off, len)) in parts.iter().enumerate() {
        let d = pattern(len as usize, 30 + i as u8);
        p.a.mr.write(off, &d)?;
        want.extend(d);
    }
    let rparts = [(0u64, 50u32), (10000, 200), (20000, 200)];
    let rsgl: Vec<Sge<'_>> = rparts.iter().map(|&(o, l)| p.b.mr.sge(o, l)).collect::<Result<_>>()?;
    p.b.qp.post_recv(&[RecvWr::new(1, &rsgl)])?;
    let sgl: Vec<Sge<'_>> = parts.iter().map(|&(o, l)| p.a.mr.sge(o, l)).collect::<Result<_>>()?;
    p.a.post(c.wr(2, SendOp::Send, &sgl, SendFlags::SIGNALED))?;
    let r = expect_one(&p.b.rcq, "receive")?;
    check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
    ensure_eq!(r.byte_len, 401, "byte_len");
    let mut got = Vec::new();
    let mut left = 401usize;
    for &(o, l) in &rparts {
        let n = left.min(l as usize);
        got.extend(p.b.mr.to_vec(o, n)?);
        left -= n;
    }
    ensure_eq!(got, want, "scattered data");
    expect_one(&p.a.scq, "send completion")?;
    Ok(())
}

fn inline_send(env: &Env, t: QpType) -> Check {
    let c = Conn::new(env, t, Mtu::Mtu1024)?;
    let p = &c.p;
    let len = 40.min(p.a.qp.cap().max_inline_data as usize);
    let mut buf = pattern(len, 17);
    let want = buf.clone();
    p.b.post_recv(1, 0, (c.grh() + 256) as u32)?;
    {
        let sge = [Sge::inline(&buf)];
        p.a.post(c.wr(2, SendOp::Send, &sge, SendFlags::SIGNALED | SendFlags::INLINE))?;
    }
    // The post returned: the buffer is the application's again.
    buf.fill(0xaa);
    let r = expect_one(&p.b.rcq, "receive of the inline send")?;
    check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
    ensure_eq!(r.byte_len as usize, c.grh() + len, "byte_len");
    ensure_eq!(p.b.mr.to_vec(c.grh() as u64, len)?, want, "received data");
    let s = expect_one(&p.a.scq, "inline send completion")?;
    check_wc(&s, 2, WcStatus::Success, Some(WcOpcode::Send), "inline send")
}

fn sizes(out: &mut Vec<Case>) {
    for mtu in Mtu::ALL.iter().copied() {
        let m = mtu.bytes();
        out.push(Case::new(
            format!("data.rc.mtu_{m}.send_write_read"),
            format!("with path MTU {m}: a send, a write and a read of 3.5 MTUs + 7 bytes and of exactly 2 MTUs arrive intact"),
            "IBTA 9.4 (segmentation at the path MTU: first/middle/last packets)",
            &[],
            move |env: &Env| multi_packet(env, QpType::Rc, mtu),
        ));
        out.push(Case::new(
            format!("data.uc.mtu_{m}.send_write"),
            format!("with path MTU {m}: a UC send and write of 3.5 MTUs + 7 bytes and of exactly 2 MTUs arrive intact"),
            "IBTA 9.4, 9.8.3 (UC segmentation)",
            &[Cap::Uc],
            move |env: &Env| multi_packet(env, QpType::Uc, mtu),
        ));
    }
    out.push(Case::new(
        "data.ud.send.port_mtu",
        "a UD send of exactly the port's active MTU arrives intact (UD messages fit one packet of the port MTU)",
        "IBTA 9.8.4 (a UD message is one packet); ibv_query_port(3) active_mtu",
        &[Cap::Ud],
        |env: &Env| {
            let c = Conn::new(env, QpType::Ud, Mtu::Mtu1024)?;
            let p = &c.p;
            let len = env.caps.port.active_mtu.bytes() as usize;
            let data = pattern(len, 18);
            p.a.mr.write(0, &data)?;
            p.b.post_recv(1, 0, (GRH + len) as u32)?;
            let sge = [p.a.mr.sge(0, len as u32)?];
            p.a.post(c.wr(2, SendOp::Send, &sge, SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "send completion")?;
            check_wc(&s, 2, WcStatus::Success, Some(WcOpcode::Send), "UD send")?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "UD receive")?;
            ensure_eq!(r.byte_len as usize, GRH + len, "byte_len");
            ensure_eq!(p.b.mr.to_vec(GRH as u64, len)?, data, "received data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.large.write_read_256k",
        "a 256 KiB RDMA write and read back (hundreds of packets) keep every byte",
        "IBTA 9.4.2, 9.4.3; docs/design.md §3.7 (ACK coalescing, bounded in-flight packets)",
        &[],
        |env: &Env| {
            let cfg = PairConfig {
                mtu: Mtu::Mtu1024,
                mr_len: 1 << 20,
                ..PairConfig::default()
            };
            let c = Conn::with(env, cfg)?;
            let p = &c.p;
            let len = 256 * 1024;
            let data = pattern(len, 19);
            p.a.mr.write(0, &data)?;
            let sge = [p.a.mr.sge(0, len as u32)?];
            p.a.post(c.wr(
                1,
                SendOp::Write {
                    remote: p.b.mr.remote(0),
                },
                &sge,
                SendFlags::SIGNALED,
            ))?;
            let s = expect_one(&p.a.scq, "write completion")?;
            check_wc(&s, 1, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write")?;
            ensure!(p.b.mr.to_vec(0, len)? == data, "written data differs");
            let sge = [p.a.mr.sge(512 * 1024, len as u32)?];
            p.a.post(c.wr(
                2,
                SendOp::Read {
                    remote: p.b.mr.remote(0),
                },
                &sge,
                SendFlags::SIGNALED,
            ))?;
            let s = expect_one(&p.a.scq, "read completion")?;
            check_wc(&s, 2, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
            ensure!(p.a.mr.to_vec(512 * 1024, len)? == data, "data read back differs");
            Ok(())
        },
    ));
}

/// Send and write (and, for RC, read) of two sizes spanning several MTUs.
fn multi_packet(env: &Env, t: QpType, mtu: Mtu) -> Check {
    let c = Conn::new(env, t, mtu)?;
    let p = &c.p;
    let m = mtu.bytes() as usize;
    for (k, len) in [3 * m + m / 2 + 7, 2 * m].into_iter().enumerate() {
        let seed = 40 + k as u8;
        let data = pattern(len, seed);
        p.a.mr.write(0, &data)?;
        p.b.post_recv(k as u64, 0, len as u32)?;
        let sge = [p.a.mr.sge(0, len as u32)?];
        p.a.post(c.wr(10 + k as u64, SendOp::Send, &sge, SendFlags::SIGNALED))?;
        let s = expect_one(&p.a.scq, "send completion")?;
        check_wc(&s, 10 + k as u64, WcStatus::Success, Some(WcOpcode::Send), "send")?;
        let r = expect_one(&p.b.rcq, "receive")?;
        check_wc(&r, k as u64, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
        ensure_eq!(r.byte_len as usize, len, "byte_len of a {len}-byte send");
        ensure!(p.b.mr.to_vec(0, len)? == data, "{len}-byte send: received data differs");
        let remote = p.b.mr.remote(WRITE_OFF);
        p.a.post(c.wr(20 + k as u64, SendOp::Write { remote }, &sge, SendFlags::SIGNALED))?;
        let s = expect_one(&p.a.scq, "write completion")?;
        check_wc(&s, 20 + k as u64, WcStatus::Success, Some(WcOpcode::RdmaWrite), "write")?;
        ensure!(
            p.b.mr.to_vec(WRITE_OFF, len)? == data,
            "{len}-byte write: remote data differs"
        );
        if t == QpType::Rc {
            let back = [p.a.mr.sge(16 * 1024, len as u32)?];
            p.a.post(c.wr(30 + k as u64, SendOp::Read { remote }, &back, SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "read completion")?;
            check_wc(&s, 30 + k as u64, WcStatus::Success, Some(WcOpcode::RdmaRead), "read")?;
            ensure!(p.a.mr.to_vec(16 * 1024, len)? == data, "{len}-byte read: data differs");
        }
    }
    Ok(())
}

fn zero_length(out: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        out.push(Case::new(
            format!("data.{}.zero_length.send", tn(t)),
            format!(
                "a {t} send with no SGE delivers a zero-length message (byte_len 0{})",
                if t == QpType::Ud { " + GRH" } else { "" }
            ),
            "IBTA 9.4.1 (zero-length messages are legal)",
            req(t),
            move |env: &Env| {
                let c = Conn::new(env, t, Mtu::Mtu1024)?;
                let p = &c.p;
                p.b.post_recv(1, 0, 256)?;
                p.a.post(c.wr(2, SendOp::Send, &[], SendFlags::SIGNALED))?;
                let s = expect_one(&p.a.scq, "send completion")?;
                check_wc(&s, 2, WcStatus::Success, Some(WcOpcode::Send), "zero-length send")?;
                let r = expect_one(&p.b.rcq, "receive")?;
                check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
                ensure_eq!(r.byte_len as usize, c.grh(), "byte_len");
                Ok(())
            },
        ));
    }
    out.push(Case::new(
        "data.rc.zero_length.write_no_rkey",
        "a zero-length RDMA write needs no valid rkey or address: it succeeds with rkey 0",
        "docs/design.md §3.5 (zero-length read/write needs no valid rkey); IBTA 9.4.2 (C9-...)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let op = SendOp::Write {
                remote: RemoteAddr { addr: 0, rkey: 0 },
            };
            p.a.post(c.wr(1, op, &[], SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "write completion")?;
            check_wc(&s, 1, WcStatus::Success, Some(WcOpcode::RdmaWrite), "zero-length write")?;
            expect_state(&p.b.qp, QpState::Rts, "responder after a zero-length write")
        },
    ));
    out.push(Case::new(
        "data.rc.zero_length.read_no_rkey",
        "a zero-length RDMA read needs no valid rkey: it succeeds with rkey 0 and byte_len 0",
        "docs/design.md §3.5 (zero-length read/write needs no valid rkey)",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let op = SendOp::Read {
                remote: RemoteAddr { addr: 0, rkey: 0 },
            };
            p.a.post(c.wr(1, op, &[], SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "read completion")?;
            check_wc(&s, 1, WcStatus::Success, Some(WcOpcode::RdmaRead), "zero-length read")?;
            ensure_eq!(s.byte_len, 0, "byte_len");
            expect_state(&p.b.qp, QpState::Rts, "responder after a zero-length read")
        },
    ));
    out.push(Case::new(
        "data.rc.zero_length.write_imm",
        "a zero-length write with immediate consumes a receive: RECV_RDMA_WITH_IMM, byte_len 0, the immediate",
        "docs/design.md §3.5",
        &[],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.b.post_recv(1, 0, 64)?;
            let op = SendOp::WriteWithImm {
                remote: RemoteAddr { addr: 0, rkey: 0 },
                imm: 42,
            };
            p.a.post(c.wr(2, op, &[], SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "write completion")?;
            let r = expect_one(&p.b.rcq, "receive")?;
            check_wc(&r, 1, WcStatus::Success, Some(WcOpcode::RecvRdmaWithImm), "receive")?;
            ensure_eq!((r.byte_len, r.imm()), (0, Some(42)), "(byte_len, imm)");
            Ok(())
        },
    ));
}

fn atomics(out: &mut Vec<Case>) {
    out.push(Case::new(
        "data.rc.cas.mismatch",
        "a compare-and-swap whose compare does not match leaves the remote word and returns it",
        "IBTA 9.4.5.1 (compare & swap)",
        &[Cap::Atomics],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.b.mr.store_u64(0, 7)?;
            let sge = [p.a.mr.sge(0, 8)?];
            let op = SendOp::CompareSwap {
                remote: p.b.mr.remote(0),
                compare: 8,
                swap: 100,
            };
            p.a.post(c.wr(1, op, &sge, SendFlags::SIGNALED))?;
            let s = expect_one(&p.a.scq, "CAS completion")?;
            check_wc(&s, 1, WcStatus::Success, Some(WcOpcode::CompSwap), "CAS")?;
            ensure_eq!(p.a.mr.load_u64(0)?, 7, "original value");
            ensure_eq!(p.b.mr.load_u64(0)?, 7, "remote word (unchanged)");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.faa.wraps",
        "fetch-and-add wraps around 2^64",
        "IBTA 9.4.5.2 (fetch & add is modulo 2^64)",
        &[Cap::Atomics],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            p.b.mr.store_u64(8, u64::MAX - 1)?;
            let sge = [p.a.mr.sge(0, 8)?];
            let op = SendOp::FetchAdd {
                remote: p.b.mr.remote(8),
                add: 5,
            };
            p.a.post(c.wr(1, op, &sge, SendFlags::SIGNALED))?;
            expect_one(&p.a.scq, "FAA completion")?;
            ensure_eq!(p.a.mr.load_u64(0)?, u64::MAX - 1, "original value");
            ensure_eq!(p.b.mr.load_u64(8)?, 3, "remote word after wrapping");
            Ok(())
        },
    ));
    out.push(Case::new(
        "data.rc.atomic.sequence",
        "16 fetch-and-adds of 1 return 0..15 in order and leave 16; then CAS(16 -> 0) succeeds",
        "IBTA 9.4.5; docs/design.md §3.7 (bounded outstanding atomics)",
        &[Cap::Atomics],
        |env: &Env| {
            let c = Conn::new(env, QpType::Rc, Mtu::Mtu1024)?;
            let p = &c.p;
            let sgl: Vec<Sge<'_>> = (0..17).map(|i| p.a.mr.sge(i * 8, 8)).collect::<Result<_>>()?;
            let remote = p.b.mr.remote(128);
            let mut wrs: Vec<SendWr<'_>> = (0..16)
                .map(|i| {
                    c.wr(
                        i as u64,
                        SendOp::FetchAdd { remote, add: 1 },
                        &sgl[i..i + 1],
                        SendFlags::SIGNALED,
                    )
                })
                .collect();
            wrs.push(c.wr(
                16,
                SendOp::CompareSwap {
                    remote,
                    compare: 16,
                    swap: 0,
                },
                &sgl[16..],
                SendFlags::SIGNALED,
            ));
            p.a.qp.post_send(&wrs)?;
            let wcs = expect_n(&p.a.scq, 17, "atomic completions")?;
            for (i, wc) in wcs.iter().enumerate() {
                check_wc(wc, i as u64, WcStatus::Success, None, "atomic")?;
            }
            for i in 0..16u64 {
                ensure_eq!(p.a.mr.load_u64(i * 8)?, i, "value returned by FAA {i}");
            }
            ensure_eq!(p.a.mr.load_u64(128)?, 16, "value returned by the CAS");
            ensure_eq!(p.b.mr.load_u64(128)?, 0, "remote word at the end");
            Ok(())
        },
    ));
}
