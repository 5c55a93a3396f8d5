//! Building blocks shared by the cases: a pair of connected QPs on two
//! contexts (which may be the same device), with registered buffers and
//! completion helpers. Written against the backend-neutral API only.

use std::time::{Duration, Instant};

use softverbs::verbs::*;

use crate::case::{Check, Stop};

/// The generous upper bound of every wait for something that must happen
/// (a completion, an event): long enough that a loaded machine never
/// flakes, and only ever reached when the device is wrong.
pub const WAIT: Duration = Duration::from_secs(5);

/// How long a case watches for something that must *not* happen (a
/// completion of a dropped message, an event that must not fire).
pub const QUIET: Duration = Duration::from_millis(40);

/// How to build a [`Pair`].
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// Transport.
    pub qp_type: QpType,
    /// Path MTU.
    pub mtu: Mtu,
    /// Queue capacities.
    pub cap: QpCap,
    /// CQ depth on each side.
    pub cq_depth: u32,
    /// Size of the registered buffer on each side.
    pub mr_len: usize,
    /// MR access on each side.
    pub mr_access: AccessFlags,
    /// QP access flags on each side.
    pub qp_access: AccessFlags,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Min RNR timer code.
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics, both directions.
    pub rd_atomic: u8,
    /// Signal every send WR.
    pub sq_sig_all: bool,
    /// Starting PSN on side A (B uses this + 1000).
    pub psn: u32,
    /// Q_Key for UD.
    pub qkey: u32,
    /// Use the send CQ for receive completions too (`rcq` then stays
    /// unused).
    pub shared_cq: bool,
}

impl PairConfig {
    /// The [`Connect`] settings of this configuration (every value set,
    /// so that both backends get the same attributes).
    pub fn connect_opts(&self) -> Connect {
        Connect::new()
            .access(self.qp_access)
            .mtu(self.mtu)
            .timeout(self.timeout)
            .retry_cnt(self.retry_cnt)
            .rnr_retry(self.rnr_retry)
            .min_rnr_timer(self.min_rnr_timer)
            .max_rd_atomic(self.rd_atomic)
            .max_dest_rd_atomic(self.rd_atomic)
    }
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            cq_depth: 256,
            mr_len: 1 << 16,
            mr_access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qp_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            sq_sig_all: false,
            psn: 0x1234,
            qkey: 0x1111_1111,
            shared_cq: false,
        }
    }
}

/// One end of a [`Pair`].
pub struct Side {
    /// The context.
    pub ctx: Context,
    /// The PD.
    pub pd: Pd,
    /// Send CQ.
    pub scq: Cq,
    /// Receive CQ.
    pub rcq: Cq,
    /// The QP.
    pub qp: Qp,
    /// A registered buffer.
    pub mr: Mr,
    /// The GID index used.
    pub gid_index: u8,
    /// The GID at that index.
    pub gid: Gid,
    /// Starting send PSN.
    pub psn: u32,
}

/// Two QPs connected to each other.
pub struct Pair {
    /// Side A.
    pub a: Side,
    /// Side B.
    pub b: Side,
    /// The configuration used.
    pub cfg: PairConfig,
}

/// The first populated GID of port 1.
///
/// # Errors
///
/// `ENOENT` when the port has no GID.
pub fn first_gid(ctx: &Context) -> Result<(u8, Gid)> {
    let port = ctx.query_port(1)?;
    for i in 0..port.gid_tbl_len.min(256) {
        let g = ctx.query_gid(1, i)?;
        if !g.is_zero() {
            return Ok((i as u8, g));
        }
    }
    Err(Error::new(Verb::QueryGid, ErrorKind::NotFound, "port 1 has no GID"))
}

impl Side {
    /// Creates the objects of one side (QP in RESET).
    ///
    /// # Errors
    ///
    /// Any verb's error.
    pub fn new(ctx: &Context, cfg: &PairConfig, psn: u32) -> Result<Side> {
        let pd = ctx.alloc_pd()?;
        let scq = ctx.create_cq(cfg.cq_depth, 1, None, 0)?;
        let rcq = ctx.create_cq(cfg.cq_depth, 2, None, 0)?;
        let rcq_or_shared = if cfg.shared_cq { &scq } else { &rcq };
        let qp = pd.create_qp(&QpInitAttr {
            qp_type: cfg.qp_type,
            send_cq: &scq,
            recv_cq: rcq_or_shared,
            srq: None,
            cap: cfg.cap,
            sq_sig_all: cfg.sq_sig_all,
        })?;
        let mr = pd.alloc_mr(cfg.mr_len, cfg.mr_access)?;
        let (gid_index, gid) = first_gid(ctx)?;
        Ok(Side {
            ctx: ctx.clone(),
            pd,
            scq,
            rcq,
            qp,
            mr,
            gid_index,
            gid,
            psn,
        })
    }

    /// This side as its peer sees it (port 1, `cfg`'s MTU and Q_Key).
    pub fn endpoint(&self, cfg: &PairConfig) -> Endpoint {
        Endpoint {
            qpn: self.qp.qp_num(),
            psn: self.psn,
            gid: self.gid,
            gid_index: self.gid_index,
            port: 1,
            lid: 0,
            mtu: cfg.mtu,
            qkey: cfg.qkey,
            buffer: None,
        }
    }

    /// RESET→INIT with the usual attributes.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_init(&self, cfg: &PairConfig) -> Result<()> {
        qp_to_init(&self.qp, cfg)
    }

    /// INIT→RTR towards `remote`.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_rtr(&self, cfg: &PairConfig, remote: &Side) -> Result<()> {
        qp_to_rtr(
            &self.qp,
            cfg,
            self.gid_index,
            remote.gid,
            remote.qp.qp_num(),
            remote.psn,
        )
    }

    /// RTR→RTS.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_rts(&self, cfg: &PairConfig) -> Result<()> {
        qp_to_rts(&self.qp, cfg, self.psn)
    }

    /// An address handle towards `remote` (for UD sends).
    ///
    /// # Errors
    ///
    /// As `create_ah`.
    pub fn ah_to(&self, remote: &Side) -> Result<Ah> {
        self.pd.create_ah(&AhAttr::roce(remote.gid, self.gid_index, 1))
    }

    /// Posts one send work request.
    ///
    /// # Errors
    ///
    /// As `post_send`.
    pub fn post(&self, wr: SendWr<'_>) -> std::result::Result<(), PostError> {
        self.qp.post_send(&[wr])
    }

    /// Moves the QP to `state` with only the STATE bit (RESET, ERR, SQD).
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn move_to(&self, state: QpState) -> Result<()> {
        set_state(&self.qp, state)
    }

    /// Posts one receive of `len` bytes at `offset` of the side's MR.
    ///
    /// # Errors
    ///
    /// As `post_recv`.
    pub fn post_recv(&self, wr_id: u64, offset: u64, len: u32) -> Result<()> {
        let sge = [self.mr.sge(offset, len)?];
        self.qp.post_recv(&[RecvWr::new(wr_id, &sge)]).map_err(|e| e.error)
    }

    /// Waits for one completion on the send CQ.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` after `timeout`, or the poll error.
    pub fn wait_send(&self, timeout: Duration) -> Result<WorkCompletion> {
        wait_one(&self.scq, timeout)
    }

    /// Waits for one completion on the receive CQ.
    ///
    /// # Errors
    ///
    /// As [`Side::wait_send`].
    pub fn wait_recv(&self, timeout: Duration) -> Result<WorkCompletion> {
        wait_one(&self.rcq, timeout)
    }

    /// The QP's state as `query_qp` reports it.
    ///
    /// # Errors
    ///
    /// As `query_qp`.
    pub fn state(&self) -> Result<QpState> {
        Ok(self.qp.query()?.qp_state)
    }
}

/// Polls `cq` until one completion arrives or `timeout` passes.
///
/// # Errors
///
/// `ETIMEDOUT`, or the poll error.
pub fn wait_one(cq: &Cq, timeout: Duration) -> Result<WorkCompletion> {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if start.elapsed() > timeout {
            return Err(Error::new(
                Verb::PollCq,
                ErrorKind::TimedOut,
                "no completion within the timeout",
            ));
        }
        std::hint::spin_loop();
    }
}

/// Polls `cq` until `n` completions arrived or `timeout` passed.
///
/// # Errors
///
/// `ETIMEDOUT` (with the completions so far lost), or the poll error.
pub fn wait_n(cq: &Cq, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 16];
    while out.len() < n {
        let k = cq.poll(&mut wc)?;
        out.extend_from_slice(&wc[..k]);
        if out.len() < n && start.elapsed() > timeout {
            return Err(Error::new(
                Verb::PollCq,
                ErrorKind::TimedOut,
                format!("{} of {n} completions within the timeout", out.len()),
            ));
        }
    }
    Ok(out)
}

/// Whether `cq` stays empty for `dur` (polling, so inline progress runs).
///
/// # Errors
///
/// The poll error.
pub fn stays_empty(cq: &Cq, dur: Duration) -> Result<bool> {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default()];
    while start.elapsed() < dur {
        if cq.poll(&mut wc)? > 0 {
            return Ok(false);
        }
        std::thread::yield_now();
    }
    Ok(true)
}

impl Pair {
    /// Creates both sides and connects them (both QPs in RTS).
    ///
    /// # Errors
    ///
    /// Any verb's error.
    pub fn new(ctx_a: &Context, ctx_b: &Context, cfg: PairConfig) -> Result<Pair> {
        let pair = Pair::unconnected(ctx_a, ctx_b, cfg)?;
        pair.connect()?;
        Ok(pair)
    }

    /// Creates both sides with QPs in RESET.
    ///
    /// # Errors
    ///
    /// Any verb's error.
    pub fn unconnected(ctx_a: &Context, ctx_b: &Context, cfg: PairConfig) -> Result<Pair> {
        let a = Side::new(ctx_a, &cfg, cfg.psn)?;
        let b = Side::new(ctx_b, &cfg, (cfg.psn + 1000) & 0xff_ffff)?;
        Ok(Pair { a, b, cfg })
    }

    /// Moves both QPs RESET→INIT→RTR→RTS.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn connect(&self) -> Result<()> {
        let opts = self.cfg.connect_opts();
        let (ea, eb) = (self.a.endpoint(&self.cfg), self.b.endpoint(&self.cfg));
        opts.apply(&self.a.ctx, &self.a.qp, &ea, Some(&eb))?;
        opts.apply(&self.b.ctx, &self.b.qp, &eb, Some(&ea))
    }
}

/// RESET→INIT with the required attributes of `cfg.qp_type`: P_Key index
/// 0, port 1, and the Q_Key (UD) or the access flags (UC, RC).
///
/// # Errors
///
/// As `modify_qp`.
pub fn qp_to_init(qp: &Qp, cfg: &PairConfig) -> Result<()> {
    let m = QpModify::new()
        .with_state(QpState::Init)
        .with_pkey_index(0)
        .with_port_num(1);
    match qp.qp_type() {
        QpType::Ud => m.with_qkey(cfg.qkey),
        _ => m.with_access_flags(cfg.qp_access),
    }
    .apply(qp)
}

/// INIT→RTR towards QP `dest_qpn` at `dgid` (whose first PSN is `rq_psn`),
/// from local GID index `sgid_index`; UD needs only the state.
///
/// # Errors
///
/// As `modify_qp`.
pub fn qp_to_rtr(qp: &Qp, cfg: &PairConfig, sgid_index: u8, dgid: Gid, dest_qpn: u32, rq_psn: u32) -> Result<()> {
    let m = QpModify::new().with_state(QpState::Rtr);
    let m = match qp.qp_type() {
        QpType::Ud => m,
        t => {
            let m = m
                .with_path_mtu(cfg.mtu)
                .with_dest_qp_num(dest_qpn)
                .with_rq_psn(rq_psn)
                .with_ah_attr(AhAttr::roce(dgid, sgid_index, 1));
            match t {
                QpType::Rc => m
                    .with_max_dest_rd_atomic(cfg.rd_atomic)
                    .with_min_rnr_timer(cfg.min_rnr_timer),
                _ => m,
            }
        }
    };
    m.apply(qp)
}

/// RTR→RTS with first send PSN `sq_psn` (and, for RC, `cfg`'s timeout,
/// retry counts and read/atomic depth).
///
/// # Errors
///
/// As `modify_qp`.
pub fn qp_to_rts(qp: &Qp, cfg: &PairConfig, sq_psn: u32) -> Result<()> {
    let m = QpModify::new().with_state(QpState::Rts).with_sq_psn(sq_psn);
    match qp.qp_type() {
        QpType::Rc => m
            .with_timeout(cfg.timeout)
            .with_retry_cnt(cfg.retry_cnt)
            .with_rnr_retry(cfg.rnr_retry)
            .with_max_rd_atomic(cfg.rd_atomic),
        _ => m,
    }
    .apply(qp)
}

/// A modify with only the STATE bit (any→RESET, any→ERR, RTS→SQD, …).
///
/// # Errors
///
/// As `modify_qp`.
pub fn set_state(qp: &Qp, state: QpState) -> Result<()> {
    let a = QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    qp.modify(&a, QpAttrMask::STATE)
}

/// Creates a QP on `pd` with the given CQs, SRQ and capacities.
///
/// # Errors
///
/// As `create_qp`.
pub fn create_qp(pd: &Pd, qp_type: QpType, scq: &Cq, rcq: &Cq, srq: Option<&Srq>, cap: QpCap) -> Result<Qp> {
    pd.create_qp(&QpInitAttr {
        qp_type,
        send_cq: scq,
        recv_cq: rcq,
        srq,
        cap,
        sq_sig_all: false,
    })
}

/// Connects two RC/UC QPs created outside a [`Pair`] (RESET→RTS on both),
/// with PSNs `cfg.psn` (A) and `cfg.psn + 1000` (B).
///
/// # Errors
///
/// As `modify_qp`.
pub fn connect_qps(cfg: &PairConfig, a: (&Qp, u8, Gid), b: (&Qp, u8, Gid)) -> Result<()> {
    let (pa, pb) = (cfg.psn, (cfg.psn + 1000) & 0xff_ffff);
    qp_to_init(a.0, cfg)?;
    qp_to_init(b.0, cfg)?;
    qp_to_rtr(a.0, cfg, a.1, b.2, b.0.qp_num(), pb)?;
    qp_to_rtr(b.0, cfg, b.1, a.2, a.0.qp_num(), pa)?;
    qp_to_rts(a.0, cfg, pa)?;
    qp_to_rts(b.0, cfg, pb)
}

/// Waits up to `timeout` for an async event on `ctx` satisfying `want`;
/// other events are consumed and ignored.
///
/// # Errors
///
/// The error of `get_async_event`.
pub fn wait_async(
    ctx: &Context,
    timeout: Duration,
    mut want: impl FnMut(&AsyncEvent) -> bool,
) -> Result<Option<AsyncEvent>> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match ctx.get_async_event(Some(left))? {
            Some(e) if want(&e) => return Ok(Some(e)),
            Some(_) if !left.is_zero() => continue,
            _ => return Ok(None),
        }
    }
}

/// Everything `cq` delivers within `dur` (polling throughout).
///
/// # Errors
///
/// The poll error.
pub fn collect(cq: &Cq, dur: Duration) -> Result<Vec<WorkCompletion>> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    loop {
        let n = cq.poll(&mut wc)?;
        out.extend_from_slice(&wc[..n]);
        if start.elapsed() >= dur {
            return Ok(out);
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
}

/// Waits for one completion on `cq`, failing the case (naming `what`) if
/// none arrives within [`WAIT`].
///
/// # Errors
///
/// [`Stop::Fail`] on timeout or a poll error.
pub fn expect_one(cq: &Cq, what: &str) -> std::result::Result<WorkCompletion, Stop> {
    wait_one(cq, WAIT).map_err(|e| Stop::Fail(format!("{what}: {e}")))
}

/// Waits for `n` completions on `cq` (see [`expect_one`]).
///
/// # Errors
///
/// [`Stop::Fail`] on timeout or a poll error.
pub fn expect_n(cq: &Cq, n: usize, what: &str) -> std::result::Result<Vec<WorkCompletion>, Stop> {
    wait_n(cq, n, WAIT).map_err(|e| Stop::Fail(format!("{what}: {e}")))
}

/// Checks a completion's `wr_id`, status and (for successes) opcode.
///
/// # Errors
///
/// [`Stop::Fail`] describing the difference.
pub fn check_wc(wc: &WorkCompletion, wr_id: u64, status: WcStatus, opcode: Option<WcOpcode>, what: &str) -> Check {
    if wc.wr_id != wr_id || wc.status != status {
        return Err(Stop::Fail(format!(
            "{what}: expected wr_id {wr_id} with status '{status}', got wr_id {} with '{}' (vendor_err {:#x})",
            wc.wr_id, wc.status, wc.vendor_err
        )));
    }
    if let Some(op) = opcode {
        if wc.opcode != op {
            return Err(Stop::Fail(format!(
                "{what}: expected opcode {op}, got {} (wr_id {wr_id})",
                wc.opcode
            )));
        }
    }
    Ok(())
}

/// Checks that `cq` stays empty for [`QUIET`].
///
/// # Errors
///
/// [`Stop::Fail`] naming the unexpected completion.
pub fn expect_quiet(cq: &Cq, what: &str) -> Check {
    let got = collect(cq, QUIET)?;
    match got.first() {
        None => Ok(()),
        Some(wc) => Err(Stop::Fail(format!(
            "{what}: expected no completion, got {} (wr_id {}, status '{}', opcode {})",
            got.len(),
            wc.wr_id,
            wc.status,
            wc.opcode
        ))),
    }
}

/// Checks that a post failed at WR `index` with `kind`.
///
/// # Errors
///
/// [`Stop::Fail`] if the post succeeded or failed differently; a
/// [`Stop::Skip`] if it failed with `EOPNOTSUPP` and that was not expected.
pub fn expect_post_err(r: std::result::Result<(), PostError>, index: usize, kind: ErrorKind, what: &str) -> Check {
    match r {
        Ok(()) => Err(Stop::Fail(format!(
            "{what}: the post succeeded; expected {} at WR {index}",
            errno_name(kind)
        ))),
        Err(e) if e.index == index && e.error.kind() == kind => Ok(()),
        Err(e) if e.error.kind() == ErrorKind::NotSupported => Err(crate::case::not_supported(&e.error)),
        Err(e) => Err(Stop::Fail(format!(
            "{what}: expected {} at WR {index}, got {} at WR {}: {}",
            errno_name(kind),
            errno_name(e.error.kind()),
            e.index,
            e.error
        ))),
    }
}

/// Checks that a verb failed with `kind`.
///
/// # Errors
///
/// [`Stop::Fail`] if it succeeded or failed differently.
pub fn expect_err<T>(r: Result<T>, kind: ErrorKind, what: &str) -> Check {
    match r {
        Ok(_) => Err(Stop::Fail(format!("{what}: succeeded; expected {}", errno_name(kind)))),
        Err(e) if e.kind() == kind => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotSupported => Err(crate::case::not_supported(&e)),
        Err(e) => Err(Stop::Fail(format!(
            "{what}: expected {}, got {}: {e}",
            errno_name(kind),
            errno_name(e.kind())
        ))),
    }
}

/// `EINVAL`-style name of an error kind.
pub fn errno_name(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::InvalidArgument => "EINVAL".into(),
        ErrorKind::NoMemory => "ENOMEM".into(),
        ErrorKind::Busy => "EBUSY".into(),
        ErrorKind::NoDevice => "ENODEV".into(),
        ErrorKind::NotSupported => "EOPNOTSUPP".into(),
        ErrorKind::Io => "EIO".into(),
        ErrorKind::NotFound => "ENOENT".into(),
        ErrorKind::WouldBlock => "EAGAIN".into(),
        ErrorKind::TimedOut => "ETIMEDOUT".into(),
        ErrorKind::PermissionDenied => "EPERM".into(),
        ErrorKind::Other(e) => format!("errno {e}"),
        _ => format!("{kind:?}"),
    }
}

/// Checks that the QP is in `state`.
///
/// # Errors
///
/// [`Stop::Fail`] naming the state it is in, or the query error.
pub fn expect_state(qp: &Qp, state: QpState, what: &str) -> Check {
    let now = qp.query()?.qp_state;
    if now != state {
        return Err(Stop::Fail(format!("{what}: the QP is in {now}, expected {state}")));
    }
    Ok(())
}

/// A deterministic byte pattern (distinct per `seed`).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(u32::from(seed) * 7 + 1) as u8)
        .collect()
}

/// The UDP source port of packets [`inject_packet`] crafts.
pub const INJECT_SRC_PORT: u16 = 0xc0de;

/// Delivers a crafted RoCEv2 packet (`headers` and `payload`, emitted with
/// its ICRC) to `device` as if its link had received it from the address
/// of `src`: for responder-side rules a conforming requester never
/// violates, so the verbs API cannot produce the packet (a misaligned
/// atomic, say). The packet goes through every check of the device's
/// receive path; its consequences (answers, completions, async events)
/// happen before this returns.
///
/// Soft provider only ([`softverbs::soft::DeviceShared::inject_datagram`]):
/// on any other backend the case is skipped, since nothing here can put a
/// crafted packet on a NIC's wire.
///
/// # Errors
///
/// [`Stop::Skip`] on a backend other than the soft provider;
/// [`Stop::Fail`] if the packet cannot be built (headers inconsistent with
/// the payload, or `src` and the device in different IP families).
pub fn inject_packet(device: &Device, src: Gid, headers: &softverbs::soft::wire::PacketRepr, payload: &[u8]) -> Check {
    use softverbs::soft::wire::{fill_icrc, IpPseudoHeader, UdpPorts};
    let shared = injectable(device)?.shared().clone();
    let src_ip = src.to_ip();
    let Some(&dst) = shared.addrs().first() else {
        return Err(Stop::Fail(format!("{} has no address to inject to", device.name())));
    };
    let mut buf = vec![0; headers.packet_len(payload.len())];
    headers
        .emit(payload, &mut buf)
        .map_err(|e| Stop::Fail(format!("building the injected packet: {e:?}")))?;
    let ip = IpPseudoHeader::between(src_ip, dst)
        .ok_or_else(|| Stop::Fail(format!("cannot inject from {src_ip} to {dst}: different IP families")))?;
    let ports = UdpPorts {
        src: INJECT_SRC_PORT,
        dst: shared.roce_port(),
    };
    fill_icrc(&ip, ports, &mut buf).map_err(|e| Stop::Fail(format!("ICRC of the injected packet: {e:?}")))?;
    shared.inject_datagram(src_ip, INJECT_SRC_PORT, buf);
    Ok(())
}

/// Skips the case unless [`inject_packet`] can reach `device` (a soft
/// provider device): for cases to call before they set anything up.
///
/// # Errors
///
/// [`Stop::Skip`] on any other backend, with the reason.
pub fn require_injection(device: &Device) -> Check {
    injectable(device).map(|_| ())
}

fn injectable(device: &Device) -> std::result::Result<&softverbs::soft::SoftDevice, Stop> {
    softverbs::verbs::backend::downcast::<softverbs::soft::SoftDevice, _>(device.ops()).ok_or_else(|| {
        Stop::Skip(format!(
            "needs raw packet injection, which only the soft provider offers ({} is a {} device: nothing here \
             can put a crafted packet on its wire)",
            device.name(),
            device.backend()
        ))
    })
}
