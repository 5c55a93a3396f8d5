//! Traffic that survives hotplug checks: a connected RC pair on one device
//! (the sender's QP talks to the receiver's QP through the device's own
//! address) with a ledger of every work request that was posted, so a test
//! can assert that each completes exactly once, send and receive queues in
//! post order, with success or WR_FLUSH_ERR.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softverbs::verbs::{
    AccessFlags, AhAttr, Context, Cq, Error, ErrorKind, Gid, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr, QpModify, QpState,
    QpType, RecvWr, Result, SendFlags, SendOp, SendWr, Verb, WcStatus, WorkCompletion,
};

/// Bytes per message.
pub const MSG_LEN: u32 = 64;

/// Every work request posted and not yet completed, per queue, in post
/// order; and every way the completions broke the contract.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Send WRs outstanding (post order).
    pub sends: VecDeque<u64>,
    /// Receive WRs outstanding (post order).
    pub recvs: VecDeque<u64>,
    /// WRs posted so far.
    pub posted: u64,
    /// Completions seen so far.
    pub completed: u64,
    /// Completions seen with WR_FLUSH_ERR.
    pub flushed: u64,
    /// Contract violations (duplicate, unknown or out-of-order completions,
    /// unexpected statuses).
    pub violations: Vec<String>,
}

impl Ledger {
    fn complete(queue: &mut VecDeque<u64>, what: &str, wc: &WorkCompletion, violations: &mut Vec<String>) {
        match queue.front() {
            Some(&id) if id == wc.wr_id => {
                queue.pop_front();
            }
            _ => match queue.iter().position(|&id| id == wc.wr_id) {
                Some(i) => {
                    violations.push(format!("{what} wr {} completed before {} earlier one(s)", wc.wr_id, i));
                    queue.remove(i);
                }
                None => violations.push(format!("{what} wr {} completed twice or was never posted", wc.wr_id)),
            },
        }
        if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
            violations.push(format!("{what} wr {} completed with {}", wc.wr_id, wc.status));
        }
    }

    /// Work requests posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.sends.len() + self.recvs.len()
    }

    /// `Ok` if nothing is outstanding and nothing broke the contract.
    ///
    /// # Errors
    ///
    /// A description of what is wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !self.violations.is_empty() {
            return Err(self.violations.join("; "));
        }
        if self.outstanding() > 0 {
            return Err(format!(
                "{} send and {} receive WR(s) never completed (first: {:?} / {:?})",
                self.sends.len(),
                self.recvs.len(),
                self.sends.front(),
                self.recvs.front()
            ));
        }
        Ok(())
    }
}

/// A connected RC pair on one device: `sender` sends to `receiver`; every
/// WR signaled; one send CQ (the sender's sends) and one receive CQ (the
/// receiver's receives).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use softverbs::soft::{link::inproc::InprocFabric, SoftDevice, SoftDeviceConfig};
/// use softverbs_emulator::netns::traffic::RcLoop;
///
/// let cfg = SoftDeviceConfig {
///     link: Some(InprocFabric::new()),
///     ..SoftDeviceConfig::new("doc_rcloop0", "10.77.0.1".parse().unwrap())
/// };
/// let dev = SoftDevice::create(cfg)?;
/// let mut lp = RcLoop::new(dev.open()?, 32)?;
/// assert_eq!(lp.post(8), 8);
/// assert!(lp.settle(Duration::from_secs(5)));
/// lp.ledger().check().unwrap();
/// drop(lp);
/// dev.unplug();
/// # Ok::<(), softverbs::verbs::Error>(())
/// ```
pub struct RcLoop {
    // Field order is drop order: QPs before their CQs, the MR before its PD.
    sender: Qp,
    receiver: Qp,
    scq: Cq,
    rcq: Cq,
    mr: Mr,
    pd: Pd,
    ctx: Context,
    depth: u32,
    next_id: u64,
    ledger: Ledger,
    wc: Vec<WorkCompletion>,
}

impl std::fmt::Debug for RcLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcLoop")
            .field("device", &self.ctx.device_name())
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

/// The first populated GID of port 1: (index, GID).
///
/// # Errors
///
/// `ENOENT` when the port has none; the query's error.
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

/// Walks an RC QP from RESET to RTS, connected to QP `dest_qpn` at `gid`
/// (index, GID) whose first PSN is `rq_psn`; this side sends from `sq_psn`.
/// Infinite RNR retries, so a send with no receive posted waits (and is
/// flushed if the device goes away).
///
/// # Errors
///
/// The first `modify_qp` that fails.
pub fn connect_rc(qp: &Qp, gid: (u8, Gid), dest_qpn: u32, rq_psn: u32, sq_psn: u32) -> Result<()> {
    let init = QpModify::new()
        .with_state(QpState::Init)
        .with_pkey_index(0)
        .with_port_num(1);
    let rtr = QpModify::new().with_state(QpState::Rtr).with_path_mtu(Mtu::Mtu1024);
    let rtr = rtr.with_dest_qp_num(dest_qpn).with_rq_psn(rq_psn);
    let rts = QpModify::new()
        .with_state(QpState::Rts)
        .with_sq_psn(sq_psn)
        .with_timeout(14);
    init.with_access_flags(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        .apply(qp)?;
    rtr.with_ah_attr(AhAttr::roce(gid.1, gid.0, 1))
        .with_max_dest_rd_atomic(1)
        .with_min_rnr_timer(1)
        .apply(qp)?;
    rts.with_retry_cnt(7).with_rnr_retry(7).with_max_rd_atomic(1).apply(qp)
}

impl RcLoop {
    /// Builds and connects the pair on `ctx`'s device, with queues of
    /// `depth` WRs (and CQs big enough never to overrun).
    ///
    /// # Errors
    ///
    /// The first verb that fails.
    pub fn new(ctx: Context, depth: u32) -> Result<RcLoop> {
        let depth = depth.max(2);
        let pd = ctx.alloc_pd()?;
        let mr = pd.alloc_mr((depth * MSG_LEN) as usize, AccessFlags::LOCAL_WRITE)?;
        let scq = ctx.create_cq(depth * 2, 1, None, 0)?;
        let rcq = ctx.create_cq(depth * 2, 2, None, 0)?;
        let cap = QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let attr = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            cap,
            sq_sig_all: false,
        };
        let sender = pd.create_qp(&attr)?;
        let receiver = pd.create_qp(&attr)?;
        let gid = first_gid(&ctx)?;
        connect_rc(&sender, gid, receiver.qp_num(), 0x200, 0x100)?;
        connect_rc(&receiver, gid, sender.qp_num(), 0x100, 0x200)?;
        Ok(RcLoop {
            sender,
            receiver,
            scq,
            rcq,
            mr,
            pd,
            ctx,
            depth,
            next_id: 1,
            ledger: Ledger::default(),
            wc: vec![WorkCompletion::default(); 32],
        })
    }

    /// Posts up to `n` messages (a receive on the receiver, then a signaled
    /// send on the sender), as many as the queues have room for; returns how
    /// many were posted. A rejected post (the device is gone and the backend
    /// refuses instead of flushing) stops posting; it is not in the ledger.
    pub fn post(&mut self, n: usize) -> usize {
        let room = (self.depth as usize).saturating_sub(self.ledger.sends.len().max(self.ledger.recvs.len()));
        let mut done = 0;
        for _ in 0..n.min(room) {
            let id = self.next_id;
            self.next_id += 1;
            let slot = u64::from((id % u64::from(self.depth)) as u32 * MSG_LEN);
            let Ok(sge) = self.mr.sge(slot, MSG_LEN) else { break };
            let sgl = [sge];
            if self.receiver.post_recv(&[RecvWr::new(id, &sgl)]).is_err() {
                break;
            }
            self.ledger.recvs.push_back(id);
            self.ledger.posted += 1;
            let wr = SendWr::new(id, SendOp::Send, &sgl).flags(SendFlags::SIGNALED);
            if self.sender.post_send(&[wr]).is_err() {
                break;
            }
            self.ledger.sends.push_back(id);
            self.ledger.posted += 1;
            done += 1;
        }
        done
    }

    /// Polls both CQs once; returns how many completions were taken.
    pub fn poll(&mut self) -> usize {
        let mut total = 0;
        for recv in [false, true] {
            loop {
                let cq = if recv { &self.rcq } else { &self.scq };
                let n = match cq.poll(&mut self.wc) {
                    Ok(n) => n,
                    Err(e) => {
                        self.ledger.violations.push(format!("poll failed: {e}"));
                        0
                    }
                };
                for wc in &self.wc[..n] {
                    let (queue, what) = if recv {
                        (&mut self.ledger.recvs, "receive")
                    } else {
                        (&mut self.ledger.sends, "send")
                    };
                    Ledger::complete(queue, what, wc, &mut self.ledger.violations);
                    self.ledger.completed += 1;
                    if wc.status == WcStatus::WrFlushErr {
                        self.ledger.flushed += 1;
                    }
                }
                total += n;
                if n < self.wc.len() {
                    break;
                }
            }
        }
        total
    }

    /// Polls until nothing is outstanding or `timeout` passes; `true` if
    /// nothing is.
    pub fn settle(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            self.poll();
            if self.ledger.outstanding() == 0 {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The sending QP.
    pub fn sender(&self) -> &Qp {
        &self.sender
    }

    /// The receiving QP.
    pub fn receiver(&self) -> &Qp {
        &self.receiver
    }

    /// The CQ of the sender's sends.
    pub fn send_cq(&self) -> &Cq {
        &self.scq
    }

    /// The CQ of the receiver's receives.
    pub fn recv_cq(&self) -> &Cq {
        &self.rcq
    }

    /// The registered buffer (`depth` slots of [`MSG_LEN`] bytes).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Tears the pair down explicitly, destroying each object (which must
    /// succeed, also after the device was removed).
    ///
    /// # Errors
    ///
    /// The first destroy that fails.
    pub fn destroy(self) -> Result<()> {
        let RcLoop {
            sender,
            receiver,
            scq,
            rcq,
            mr,
            pd,
            ctx,
            ..
        } = self;
        sender.destroy()?;
        receiver.destroy()?;
        scq.destroy()?;
        rcq.destroy()?;
        mr.destroy()?;
        pd.destroy()?;
        drop(ctx);
        Ok(())
    }
}
