//! One end of a test: its context, PD, completion channel, CQs, QPs and one
//! registered buffer, and the address record ([`Dest`]) the ends exchange,
//! as perftest's `pingpong_context` and `pingpong_dest`.
//!
//! Buffer layout: QP `i` owns two slots of [`Side::slot`] bytes at
//! `2·i·slot`: the first is what it sends (and where reads and atomics
//! land), the second is what the peer writes into, reads from or sends into
//! (the address its [`Dest`] advertises). Slots are cache-line multiples so
//! atomics stay 8-byte aligned.

use std::cell::Cell;

use softverbs::verbs::{
    AccessFlags, Ah, AhAttr, CompChannel, Connect, Context, Cq, Endpoint, Gid, LinkLayer, Mr, Mtu, Pd, Qp, QpCap,
    QpInitAttr, QpType, RecvWr, RemoteAddr, Sge,
};

use super::args::{Connection, Params, VerbKind};
use super::{PerfError, VerbsContext};

/// The Q_Key perftest uses for UD.
pub const DEF_QKEY: u32 = 0x1111_1111;
/// UD receive buffers start with the 40-byte GRH.
pub const GRH_LEN: u64 = 40;
/// perftest's default local ACK timeout exponent.
pub const DEF_QP_TIME: u8 = 14;
/// perftest's min RNR timer code.
pub const DEF_MIN_RNR_TIMER: u8 = 12;

/// What one end tells the other about one QP (perftest's `pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding reads/atomics the QP accepts.
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Address of the QP's target slot.
    pub vaddr: u64,
    /// GID.
    pub gid: Gid,
    /// SRQ number (unused: 0).
    pub srqn: u32,
}

/// Length of perftest's key message with a GID (`KEY_MSG_SIZE_GID`),
/// including the terminating NUL.
pub const KEY_MSG_SIZE_GID: usize = 108;

impl Dest {
    /// perftest's key message (`KEY_PRINT_FMT_GID`), NUL-terminated, 108
    /// bytes.
    pub fn to_key_msg(&self) -> [u8; KEY_MSG_SIZE_GID] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_MSG_SIZE_GID];
        let n = s.len().min(KEY_MSG_SIZE_GID - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses a key message.
    ///
    /// # Errors
    ///
    /// [`PerfError::Failed`] when the message is malformed.
    pub fn from_key_msg(msg: &[u8]) -> Result<Dest, PerfError> {
        let bad = || {
            PerfError::Failed(format!(
                "malformed address message from the peer: {:?}",
                String::from_utf8_lossy(msg)
            ))
        };
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad())?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() < 23 {
            return Err(bad());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(f[6 + i])? as u8;
        }
        Ok(Dest {
            lid: hex(f[0])? as u16,
            out_reads: hex(f[1])? as u32,
            qpn: hex(f[2])? as u32,
            psn: hex(f[3])? as u32,
            rkey: hex(f[4])? as u32,
            vaddr: hex(f[5])?,
            gid: Gid(gid),
            srqn: hex(f[22])? as u32,
        })
    }

    /// The remote target of this QP's slot.
    pub fn remote(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.vaddr,
            rkey: self.rkey,
        }
    }
}

/// One end of a test.
pub struct Side {
    /// The device's context.
    pub ctx: Context,
    /// Device name.
    pub dev_name: String,
    /// Protection domain.
    pub pd: Pd,
    /// Completion channel (with `-e`).
    pub channel: Option<CompChannel>,
    /// Send CQ (all QPs).
    pub scq: Cq,
    /// Receive CQ (all QPs).
    pub rcq: Cq,
    /// The QPs.
    pub qps: Vec<Qp>,
    /// The buffer.
    pub mr: Mr,
    /// Bytes per slot.
    pub slot: u64,
    /// Port.
    pub port: u8,
    /// GID index used.
    pub gid_index: u8,
    /// GID at that index.
    pub gid: Gid,
    /// Path MTU in use (requested and port MTU, whichever is smaller).
    pub mtu: Mtu,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// Starting PSN of each QP.
    pub psns: Vec<u32>,
    /// Outstanding reads/atomics.
    pub out_reads: u32,
    /// Local ACK timeout of RC QPs (`-u`).
    pub qp_timeout: u8,
    /// Inline size granted.
    pub inline_size: u32,
    /// Transport.
    pub connection: Connection,
    /// UD: one address handle per QP, to the peer's QP.
    pub ahs: Vec<Ah>,
    /// Receives posted and not yet completed, per QP.
    pub recv_outstanding: Vec<Cell<u32>>,
    /// Receive depth per QP.
    pub rx_depth: u32,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("dev", &self.dev_name)
            .field("qps", &self.qps.len())
            .finish_non_exhaustive()
    }
}

/// The first populated GID of `port`.
///
/// # Errors
///
/// [`PerfError::NotAvailable`] when the port has none.
pub fn first_gid(ctx: &Context, port: u8) -> Result<(u8, Gid), PerfError> {
    let attr = ctx.query_port(port).ctx("query_port")?;
    for i in 0..attr.gid_tbl_len.min(256) {
        let g = ctx.query_gid(port, i).ctx("query_gid")?;
        if !g.is_zero() {
            return Ok((i as u8, g));
        }
    }
    Err(PerfError::NotAvailable(format!(
        "{} port {port} has no GID",
        ctx.device_name()
    )))
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl Side {
    /// Creates the objects of one end for messages up to `max_size` (QPs in
    /// RESET). `psn_seed` varies the starting PSNs between the ends.
    ///
    /// # Errors
    ///
    /// The failing verb.
    pub fn new(ctx: &Context, p: &Params, max_size: u64, psn_seed: u32) -> Result<Side, PerfError> {
        Self::with_qps(ctx, p, max_size, psn_seed, p.qps)
    }

    /// As [`Side::new`] with `qps` QPs.
    ///
    /// # Errors
    ///
    /// The failing verb.
    pub fn with_qps(ctx: &Context, p: &Params, max_size: u64, psn_seed: u32, qps: u32) -> Result<Side, PerfError> {
        let dev_name = ctx.device_name().to_string();
        let dattr = ctx.query_device().ctx("query_device")?;
        let pattr = ctx.query_port(p.ib_port).ctx("query_port")?;
        let (gid_index, gid) = match p.gid_index {
            Some(i) => (i, ctx.query_gid(p.ib_port, u32::from(i)).ctx("query_gid")?),
            None => first_gid(ctx, p.ib_port)?,
        };
        let mtu = match p.mtu {
            Some(m) if m.bytes() <= pattr.active_mtu.bytes() => m,
            _ => pattr.active_mtu,
        };
        let ud = p.connection == Connection::Ud;
        if ud && max_size > u64::from(mtu.bytes()) {
            return Err(PerfError::Usage(format!(
                "UD messages are at most one MTU ({} bytes); size {max_size} is too large",
                mtu.bytes()
            )));
        }
        let out_reads = p
            .outs
            .unwrap_or(16)
            .min(dattr.max_qp_rd_atom)
            .min(dattr.max_qp_init_rd_atom)
            .max(1);
        let inline_size = p.inline_size.min(dattr.max_inline_data);
        let slot = round_up(max_size + if ud { GRH_LEN } else { 0 }, 64);
        let channel = if p.events {
            Some(ctx.create_comp_channel().ctx("create_comp_channel")?)
        } else {
            None
        };
        let n = qps as usize;
        let scq_depth = (p.tx_depth * qps).clamp(1, dattr.max_cqe);
        let rcq_depth = (p.rx_depth * qps).clamp(1, dattr.max_cqe);
        let scq = ctx
            .create_cq(scq_depth, 1, channel.as_ref(), 0)
            .ctx("create_cq (send)")?;
        let rcq = ctx
            .create_cq(rcq_depth, 2, channel.as_ref(), 0)
            .ctx("create_cq (recv)")?;
        let pd = ctx.alloc_pd().ctx("alloc_pd")?;
        let mr_len = (2 * slot * u64::from(qps)).max(4096);
        let mr_len = usize::try_from(mr_len).map_err(|_| PerfError::Usage("buffer too large".into()))?;
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = if p.heap {
            pd.alloc_mr_heap(mr_len, access)
        } else {
            pd.alloc_mr(mr_len, access)
        }
        .ctx("reg_mr")?;
        let recv_depth = if p.verb == VerbKind::Send { p.rx_depth } else { 1 };
        // An unsignaled send keeps its slot until a later completion
        // retires it, so send_lat's queue holds 2 * cq_mod of them (a
        // hardware provider rounds perftest's tx depth of 1 up alike).
        let send_depth = if p.verb == VerbKind::Send && p.cq_mod > 1 {
            p.tx_depth.max(2 * p.cq_mod)
        } else {
            p.tx_depth
        };
        let mut qp_list = Vec::with_capacity(n);
        for _ in 0..n {
            qp_list.push(
                pd.create_qp(&QpInitAttr {
                    qp_type: p.connection.qp_type(),
                    send_cq: &scq,
                    recv_cq: &rcq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: send_depth,
                        max_recv_wr: recv_depth,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: inline_size,
                    },
                    sq_sig_all: false,
                })
                .ctx("create_qp")?,
            );
        }
        let psns = qp_list
            .iter()
            .map(|q| (q.qp_num().wrapping_mul(0x9e37_79b1) ^ psn_seed.wrapping_mul(0x85eb_ca6b)) & 0xff_ffff)
            .collect();
        Ok(Side {
            ctx: ctx.clone(),
            dev_name,
            pd,
            channel,
            scq,
            rcq,
            qps: qp_list,
            mr,
            slot,
            port: p.ib_port,
            gid_index,
            gid,
            mtu,
            link_layer: pattr.link_layer,
            psns,
            out_reads,
            qp_timeout: p.qp_timeout,
            inline_size,
            connection: p.connection,
            ahs: Vec::new(),
            recv_outstanding: (0..n).map(|_| Cell::new(0)).collect(),
            rx_depth: recv_depth,
        })
    }

    /// Offset of QP `i`'s own (source) slot in the buffer.
    pub fn send_off(&self, i: usize) -> u64 {
        2 * self.slot * i as u64
    }

    /// Offset of QP `i`'s target slot (what the peer writes, reads or sends
    /// into).
    pub fn recv_off(&self, i: usize) -> u64 {
        self.send_off(i) + self.slot
    }

    /// The address records of this end's QPs.
    pub fn dests(&self) -> Vec<Dest> {
        self.qps
            .iter()
            .enumerate()
            .map(|(i, q)| Dest {
                lid: 0,
                out_reads: self.out_reads,
                qpn: q.qp_num(),
                psn: self.psns[i],
                rkey: self.mr.rkey(),
                vaddr: self.mr.addr() + self.recv_off(i),
                gid: self.gid,
                srqn: 0,
            })
            .collect()
    }

    /// Moves every QP to RTS towards the peer's QPs (`remote[i]` for QP
    /// `i`); for UD, creates the address handles.
    ///
    /// # Errors
    ///
    /// The failing `modify_qp` or `create_ah`.
    pub fn connect(&mut self, remote: &[Dest]) -> Result<(), PerfError> {
        if remote.len() != self.qps.len() {
            return Err(PerfError::Failed(format!(
                "the peer has {} QPs, this end {}",
                remote.len(),
                self.qps.len()
            )));
        }
        let ty = self.connection.qp_type();
        let opts = Connect::new()
            .access(AccessFlags::REMOTE)
            .mtu(self.mtu)
            .timeout(self.qp_timeout)
            .min_rnr_timer(DEF_MIN_RNR_TIMER)
            .max_dest_rd_atomic(self.out_reads.min(255) as u8);
        let ep = |qpn, psn, gid| Endpoint {
            qpn,
            psn,
            gid,
            gid_index: self.gid_index,
            port: self.port,
            lid: 0,
            mtu: self.mtu,
            qkey: DEF_QKEY,
            buffer: None,
        };
        for (i, qp) in self.qps.iter().enumerate() {
            let r = &remote[i];
            let (local, peer) = (ep(qp.qp_num(), self.psns[i], self.gid), ep(r.qpn, r.psn, r.gid));
            opts.max_rd_atomic(r.out_reads.min(self.out_reads).min(255) as u8)
                .apply(&self.ctx, qp, &local, Some(&peer))
                .ctx("modify_qp RESET->RTS")?;
        }
        if ty == QpType::Ud {
            self.ahs = remote
                .iter()
                .map(|r| self.pd.create_ah(&AhAttr::roce(r.gid, self.gid_index, self.port)))
                .collect::<Result<_, _>>()
                .ctx("create_ah")?;
        }
        Ok(())
    }

    /// Posts receives on QP `i` until `rx_depth` are outstanding.
    ///
    /// # Errors
    ///
    /// The failing `post_recv`.
    pub fn fill_recv(&self, i: usize) -> Result<(), PerfError> {
        self.fill_recv_with(i, self.recv_sge(i)?)
    }

    /// The SGE of QP `i`'s receives: its whole receive slot.
    ///
    /// # Errors
    ///
    /// Out of the buffer (a bug).
    pub fn recv_sge(&self, i: usize) -> Result<Sge<'_>, PerfError> {
        let len = u32::try_from(self.slot).unwrap_or(u32::MAX);
        self.mr.sge(self.recv_off(i), len).ctx("recv sge")
    }

    /// [`Side::fill_recv`] with the SGE [`Side::recv_sge`] gave, made once
    /// by a caller that refills after every message (as perftest posts
    /// the same prepared receive WR again).
    ///
    /// # Errors
    ///
    /// A failed `post_recv`.
    pub fn fill_recv_with(&self, i: usize, sge: Sge<'_>) -> Result<(), PerfError> {
        let sge = [sge];
        let wr = [RecvWr::new(i as u64, &sge)];
        let out = &self.recv_outstanding[i];
        while out.get() < self.rx_depth {
            self.qps[i].post_recv(&wr).ctx("post_recv")?;
            out.set(out.get() + 1);
        }
        Ok(())
    }

    /// An SGE over `len` bytes of QP `i`'s own slot.
    ///
    /// # Errors
    ///
    /// Out of the buffer (a bug).
    pub fn send_sge(&self, i: usize, len: u64) -> Result<Sge<'_>, PerfError> {
        self.mr.sge(self.send_off(i), len as u32).ctx("send sge")
    }

    /// Clears the last byte of both slots of QP `i` for `size`-byte
    /// messages, so that a ping-pong never sees a stale marker.
    ///
    /// # Errors
    ///
    /// Out of the buffer (a bug).
    pub fn clear_markers(&self, i: usize, size: u64) -> Result<(), PerfError> {
        let last = size.max(1) - 1;
        self.mr.write(self.send_off(i) + last, &[0]).ctx("clear marker")?;
        self.mr.write(self.recv_off(i) + last, &[0]).ctx("clear marker")
    }

    /// Polls `cq` into `wc`; with a completion channel (`-e`) and nothing
    /// there, arms the CQ, polls again (a completion may have slipped in
    /// before arming) and sleeps on the channel for at most `timeout_ms`
    /// before a last poll.
    ///
    /// # Errors
    ///
    /// The failing poll, `req_notify_cq` or `get_cq_event`.
    pub fn poll_or_wait(
        &self,
        cq: &Cq,
        wc: &mut [softverbs::verbs::WorkCompletion],
        timeout_ms: u64,
    ) -> Result<usize, PerfError> {
        let n = cq.poll(wc).ctx("poll_cq")?;
        let Some(ch) = &self.channel else { return Ok(n) };
        if n > 0 {
            return Ok(n);
        }
        cq.req_notify(false).ctx("req_notify_cq")?;
        let n = cq.poll(wc).ctx("poll_cq")?;
        if n > 0 {
            return Ok(n);
        }
        if let Some(ctx) = ch
            .get_cq_event(Some(std::time::Duration::from_millis(timeout_ms)))
            .ctx("get_cq_event")?
        {
            if ctx == self.scq.context() {
                self.scq.ack_events(1);
            } else {
                self.rcq.ack_events(1);
            }
        }
        cq.poll(wc).ctx("poll_cq")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_message_round_trip() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x7f00_1234_5000,
            gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 83, 86, 1]),
            srqn: 0,
        };
        let m = d.to_key_msg();
        assert_eq!(m.len(), 108);
        assert_eq!(m[107], 0);
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert!(
            text.starts_with("0000:0010:000011:abcdef:12345678:00007f0012345000:00:00:"),
            "{text}"
        );
        assert!(text.ends_with(":ff:ff:7f:53:56:01:00000000:"), "{text}");
        assert_eq!(Dest::from_key_msg(&m).unwrap(), d);
        assert!(Dest::from_key_msg(b"junk").is_err());
    }
}
