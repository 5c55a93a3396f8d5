//! Building blocks shared by the cases: a pair of connected QPs on two
//! contexts (which may be the same device), with registered buffers and
//! completion helpers. Written against the backend-neutral API only.

use std::time::{Duration, Instant};

use softverbs::verbs::*;

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
        let qp = pd.create_qp(&QpInitAttr {
            qp_type: cfg.qp_type,
            send_cq: &scq,
            recv_cq: &rcq,
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

    /// RESET→INIT with the usual attributes.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_init(&self, cfg: &PairConfig) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        if cfg.qp_type == QpType::Ud {
            a.qkey = cfg.qkey;
            mask |= QpAttrMask::QKEY;
        } else {
            a.qp_access_flags = cfg.qp_access;
            mask |= QpAttrMask::ACCESS_FLAGS;
        }
        self.qp.modify(&a, mask)
    }

    /// INIT→RTR towards `remote`.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_rtr(&self, cfg: &PairConfig, remote: &Side) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE;
        if cfg.qp_type != QpType::Ud {
            a.path_mtu = cfg.mtu;
            a.dest_qp_num = remote.qp.qp_num();
            a.rq_psn = remote.psn;
            a.ah_attr = AhAttr::roce(remote.gid, self.gid_index, 1);
            mask |= QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            if cfg.qp_type == QpType::Rc {
                a.max_dest_rd_atomic = cfg.rd_atomic;
                a.min_rnr_timer = cfg.min_rnr_timer;
                mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
            }
        }
        self.qp.modify(&a, mask)
    }

    /// RTR→RTS.
    ///
    /// # Errors
    ///
    /// As `modify_qp`.
    pub fn to_rts(&self, cfg: &PairConfig) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.psn,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if cfg.qp_type == QpType::Rc {
            a.timeout = cfg.timeout;
            a.retry_cnt = cfg.retry_cnt;
            a.rnr_retry = cfg.rnr_retry;
            a.max_rd_atomic = cfg.rd_atomic;
            mask |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.qp.modify(&a, mask)
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
        self.a.to_init(&self.cfg)?;
        self.b.to_init(&self.cfg)?;
        self.a.to_rtr(&self.cfg, &self.b)?;
        self.b.to_rtr(&self.cfg, &self.a)?;
        self.a.to_rts(&self.cfg)?;
        self.b.to_rts(&self.cfg)
    }
}
