//! Connected QP pairs on the simulated fabric: memory, protection domain,
//! CQs and a QP on each side, walked through INIT → RTR → RTS.

use std::sync::Arc;

use softverbs::soft::proto::{CqId, PdId, QpCreate};
use softverbs::verbs::{
    AccessFlags, AhAttr, MemorySource, MrMemory, Mtu, PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr,
    RemoteAddr, Result, SendWr, Sge, WorkCompletion,
};

use super::fabric::{Fabric, NodeId};

/// How to create and connect a QP pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpOptions {
    /// Transport (RC or UC).
    pub qp_type: QpType,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent (4.096 µs · 2^timeout; 0 = infinite).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// The responder's minimum RNR timer code.
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics as requester.
    pub max_rd_atomic: u8,
    /// Outstanding reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
    /// SGEs per WR (both queues).
    pub max_sge: u32,
    /// Entries per CQ.
    pub cq_depth: u32,
    /// First PSN of the A side's send queue.
    pub psn_a: u32,
    /// First PSN of the B side's send queue.
    pub psn_b: u32,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sq_depth: 1024,
            rq_depth: 1024,
            max_sge: 8,
            cq_depth: 8192,
            psn_a: 0x10_0000,
            psn_b: 0x20_0000,
        }
    }
}

/// One side of a connected QP pair: its node, objects and registered memory
/// (one MR over all of it, with local and remote access).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The node.
    pub node: NodeId,
    /// Protection domain.
    pub pd: PdId,
    /// QP number.
    pub qpn: u32,
    /// Send CQ.
    pub send_cq: CqId,
    /// Receive CQ.
    pub recv_cq: CqId,
    /// Local key of the memory.
    pub lkey: u32,
    /// Remote key of the memory.
    pub rkey: u32,
    mem: Arc<MemorySource>,
}

impl Endpoint {
    /// Creates the objects of one side (QP in RESET) with `mem_len` bytes of
    /// registered memory.
    ///
    /// # Errors
    ///
    /// The verbs error of the first call that fails.
    pub fn create(fabric: &mut Fabric, node: NodeId, mem_len: usize, opts: &QpOptions) -> Result<Endpoint> {
        let mem = Arc::new(MemorySource::Owned(MrMemory::new(mem_len.max(8))?));
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        fabric.with(node, |core, _| {
            let pd = core.alloc_pd(0)?;
            let (lkey, rkey) = core.reg_mr(pd, mem.clone(), access)?;
            let (send_cq, _) = core.create_cq(opts.cq_depth, 0, 0)?;
            let (recv_cq, _) = core.create_cq(opts.cq_depth, 1, 0)?;
            let (qpn, _) = core.create_qp(&QpCreate {
                qp_type: opts.qp_type,
                pd,
                send_cq,
                recv_cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: opts.sq_depth,
                    max_recv_wr: opts.rq_depth,
                    max_send_sge: opts.max_sge,
                    max_recv_sge: opts.max_sge,
                    max_inline_data: 256,
                },
                sq_sig_all: false,
                owner: 0,
            })?;
            Ok(Endpoint {
                node,
                pd,
                qpn,
                send_cq,
                recv_cq,
                lkey,
                rkey,
                mem: mem.clone(),
            })
        })
    }

    /// Walks the QP to RTS, connected to `peer` (whose first PSN is
    /// `peer_psn`); this side sends from `psn`.
    ///
    /// # Errors
    ///
    /// The verbs error of the modify that fails.
    pub fn connect_to(
        &self,
        fabric: &mut Fabric,
        peer: &Endpoint,
        psn: u32,
        peer_psn: u32,
        opts: &QpOptions,
    ) -> Result<()> {
        let rc = opts.qp_type == QpType::Rc;
        let av = AhAttr::roce(fabric.gid(peer.node), 0, 1);
        let qpn = self.qpn;
        fabric.with(self.node, |core, now| {
            let mut a = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
                ..QpAttr::default()
            };
            let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
            core.modify_qp(now, qpn, &a, m)?;
            a.qp_state = QpState::Rtr;
            a.ah_attr = av;
            a.path_mtu = opts.path_mtu;
            a.dest_qp_num = peer.qpn;
            a.rq_psn = peer_psn;
            a.max_dest_rd_atomic = opts.max_dest_rd_atomic;
            a.min_rnr_timer = opts.min_rnr_timer;
            let mut m =
                QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            if rc {
                m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
            }
            core.modify_qp(now, qpn, &a, m)?;
            a.qp_state = QpState::Rts;
            a.sq_psn = psn;
            a.timeout = opts.timeout;
            a.retry_cnt = opts.retry_cnt;
            a.rnr_retry = opts.rnr_retry;
            a.max_rd_atomic = opts.max_rd_atomic;
            let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
            if rc {
                m |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
            }
            core.modify_qp(now, qpn, &a, m)
        })
    }

    /// Base address of the memory.
    pub fn base(&self) -> u64 {
        self.mem.addr()
    }

    /// Length of the memory.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The registered memory.
    pub fn memory(&self) -> &Arc<MemorySource> {
        &self.mem
    }

    /// A scatter/gather entry for `len` bytes at `offset` of the memory.
    ///
    /// # Panics
    ///
    /// If the range is outside the memory.
    pub fn sge(&self, offset: u64, len: u32) -> Sge<'_> {
        let end = offset.checked_add(u64::from(len)).expect("SGE range overflows");
        assert!(
            end <= self.mem.len() as u64,
            "SGE {offset}+{len} outside {} bytes",
            self.mem.len()
        );
        // SAFETY: the range lies inside memory this endpoint owns (an Arc the
        // engine shares) and keeps registered under `lkey` for as long as the
        // endpoint exists; the returned entry borrows the endpoint, and the
        // simulator never holds Rust references into the memory (it copies
        // with `read_at`/`write_at`).
        unsafe { Sge::from_raw(self.base() + offset, len, self.lkey) }
    }

    /// The remote address of `offset` in this memory (for the peer's reads,
    /// writes and atomics).
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.base() + offset,
            rkey: self.rkey,
        }
    }

    /// Copies `len` bytes at `offset` out of the memory.
    ///
    /// # Panics
    ///
    /// If the range is outside the memory.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem
            .read_at(offset, &mut v)
            .expect("read inside the endpoint memory");
        v
    }

    /// Copies `data` into the memory at `offset`.
    ///
    /// # Panics
    ///
    /// If the range is outside the memory.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.mem
            .write_at(offset, data)
            .expect("write inside the endpoint memory");
    }

    /// The 8-byte word at `offset` (host order).
    pub fn load_u64(&self, offset: usize) -> u64 {
        let b = self.read(offset, 8);
        u64::from_ne_bytes(b.try_into().expect("8 bytes"))
    }

    /// Posts send work requests.
    ///
    /// # Errors
    ///
    /// The engine's post error.
    pub fn post_send(&self, fabric: &mut Fabric, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let qpn = self.qpn;
        fabric.with(self.node, |c, now| c.post_send(now, qpn, wrs))
    }

    /// Posts receive work requests.
    ///
    /// # Errors
    ///
    /// The engine's post error.
    pub fn post_recv(&self, fabric: &mut Fabric, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let qpn = self.qpn;
        fabric.with(self.node, |c, _| c.post_recv(qpn, wrs))
    }

    /// Drains the send CQ.
    pub fn poll_send(&self, fabric: &mut Fabric) -> Vec<WorkCompletion> {
        poll_all(fabric, self.node, self.send_cq)
    }

    /// Drains the receive CQ.
    pub fn poll_recv(&self, fabric: &mut Fabric) -> Vec<WorkCompletion> {
        poll_all(fabric, self.node, self.recv_cq)
    }

    /// The QP's state.
    pub fn state(&self, fabric: &Fabric) -> QpState {
        fabric
            .core(self.node)
            .query_qp(self.qpn)
            .map_or(QpState::Reset, |a| a.qp_state)
    }

    /// Moves the QP to ERR (flushing everything outstanding).
    ///
    /// # Errors
    ///
    /// The engine's modify error.
    pub fn to_error(&self, fabric: &mut Fabric) -> Result<()> {
        let qpn = self.qpn;
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        fabric.with(self.node, |c, now| c.modify_qp(now, qpn, &a, QpAttrMask::STATE))
    }
}

fn poll_all(fabric: &mut Fabric, node: NodeId, cq: CqId) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 32];
    fabric.with(node, |c, _| loop {
        match c.poll_cq(cq, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    });
    out
}

/// Creates and connects a QP pair between `a` and `b` with `mem_a` and
/// `mem_b` bytes of registered memory.
///
/// # Errors
///
/// The verbs error of the first call that fails.
pub fn connect(
    fabric: &mut Fabric,
    a: NodeId,
    b: NodeId,
    mem_a: usize,
    mem_b: usize,
    opts: &QpOptions,
) -> Result<(Endpoint, Endpoint)> {
    let ea = Endpoint::create(fabric, a, mem_a, opts)?;
    let eb = Endpoint::create(fabric, b, mem_b, opts)?;
    ea.connect_to(fabric, &eb, opts.psn_a, opts.psn_b, opts)?;
    eb.connect_to(fabric, &ea, opts.psn_b, opts.psn_a, opts)?;
    Ok((ea, eb))
}

/// A fresh two-node fabric (`a` = 10.0.0.1, `b` = 10.0.0.2, both link
/// directions `link`) with a connected QP pair of `mem` bytes per side.
///
/// # Errors
///
/// The verbs error of the first call that fails.
pub fn pair(seed: u64, link: super::LinkConfig, opts: &QpOptions, mem: usize) -> Result<(Fabric, Endpoint, Endpoint)> {
    let r = softverbs::soft::proto::Recovery::default();
    pair_with(seed, link, opts, mem, (r, r))
}

/// [`pair`] with the loss recovery each node offers (node a, node b).
///
/// # Errors
///
/// As [`pair`].
pub fn pair_with(
    seed: u64,
    link: super::LinkConfig,
    opts: &QpOptions,
    mem: usize,
    recovery: (softverbs::soft::proto::Recovery, softverbs::soft::proto::Recovery),
) -> Result<(Fabric, Endpoint, Endpoint)> {
    use std::net::{IpAddr, Ipv4Addr};
    let mut f = Fabric::new(seed, link);
    let mut na = super::NodeConfig::new("a", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    na.recovery = recovery.0;
    let mut nb = super::NodeConfig::new("b", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
    nb.recovery = recovery.1;
    let a = f.add_node(na);
    let b = f.add_node(nb);
    let (ea, eb) = connect(&mut f, a, b, mem, mem, opts)?;
    Ok((f, ea, eb))
}
