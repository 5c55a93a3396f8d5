//! The fast path: `ibv_send_wr` / `ibv_recv_wr` chains built on the stack.
//!
//! A batch of work requests is converted in chunks of [`WR_CHUNK`] into a
//! fixed array of ibverbs work requests, whose scatter lists share a fixed
//! pool of [`SGE_POOL`] `ibv_sge`s; each chunk is linked and handed to the
//! provider's `post_send`/`post_recv` entry point. Nothing is allocated
//! unless a single work request has more than [`SGE_POOL`] entries (only
//! possible on a QP granted that many), which then goes alone through a
//! heap list. The arrays are `MaybeUninit`: only the entries used are
//! written, so posting one WR does not clear 3 KiB.
//!
//! Stack arrays rather than a per-QP scratch buffer: they need no lock
//! (several threads may post to one QP, as ibverbs allows), have no
//! thread-local lookup, and are hot in cache.
//!
//! Errors keep ibverbs' contract: [`PostError::index`] is the first WR not
//! posted; every WR before it was posted, none from it on. Checks this
//! backend makes before calling the provider (so that memory-unsafe or
//! unrepresentable requests never reach the device) report `EINVAL` or
//! `EOPNOTSUPP` for the WR that fails them, after posting those before it.
//!
//! A QP's queues are shadowed (see `shadow.rs`): with a [`Producer`] each
//! chunk's work requests are recorded in the queue's ring before the
//! provider call and settled after it, and a full ring refuses the next
//! work request with `ENOMEM`, as a full queue does.

use std::mem::MaybeUninit;

use rdma_sys::{atomic_t, bind_mw_t, ibv_mw_bind_info, ibv_recv_wr, ibv_send_wr, ibv_sge, rdma_t, ud_t};

use super::convert;
use super::ffi::zeroed;
use super::ibv_error;
use super::ibv_object::HeldSet;
use super::objects::{HwAh, HwMr, HwMw};
use super::shadow::Producer;
use crate::verbs::backend::MwOps;
use crate::verbs::wr_check::{check_send_wr, SendLimits, SendWrFault};
use crate::verbs::{verr, Error, PostError, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, Verb, WcOpcode};

/// Work requests per provider call.
pub(crate) const WR_CHUNK: usize = 16;
/// Scatter/gather entries per provider call (shared by the chunk's WRs).
pub(crate) const SGE_POOL: usize = 64;
/// Objects a chunk may hold entered: a BIND_MW names a window and an MR.
const HOLD: usize = 2 * WR_CHUNK;

/// One provider call's worth of work requests and their scatter lists.
struct Chunk<W> {
    wrs: [MaybeUninit<W>; WR_CHUNK],
    len: usize,
    sges: [MaybeUninit<ibv_sge>; SGE_POOL],
    sges_used: usize,
    /// The scatter list of a single WR too long for the pool.
    spill: Vec<ibv_sge>,
}

impl<W> Chunk<W> {
    fn new() -> Self {
        Chunk {
            wrs: [const { MaybeUninit::uninit() }; WR_CHUNK],
            len: 0,
            sges: [const { MaybeUninit::uninit() }; SGE_POOL],
            sges_used: 0,
            spill: Vec::new(),
        }
    }

    /// Whether the next WR, with `nsge` entries, must go in a new chunk.
    fn full_for(&self, nsge: usize) -> bool {
        self.len == WR_CHUNK || !self.spill.is_empty() || (self.len > 0 && nsge > SGE_POOL - self.sges_used)
    }

    /// Copies a scatter list into the pool (or the spill list, for a WR
    /// alone in its chunk) and returns what `sg_list`/`num_sge` take.
    fn sgl(&mut self, sgl: &[Sge<'_>]) -> (*mut ibv_sge, i32) {
        let entry = |s: &Sge<'_>| ibv_sge {
            addr: s.addr(),
            length: s.length(),
            lkey: s.lkey(),
        };
        if sgl.len() > SGE_POOL - self.sges_used {
            debug_assert!(self.len == 0 && self.spill.is_empty());
            self.spill.extend(sgl.iter().map(entry));
            return (self.spill.as_mut_ptr(), sgl.len() as i32);
        }
        let start = self.sges_used;
        for (slot, s) in self.sges[start..start + sgl.len()].iter_mut().zip(sgl) {
            slot.write(entry(s));
        }
        self.sges_used += sgl.len();
        (self.sges[start..].as_mut_ptr().cast(), sgl.len() as i32)
    }

    fn push(&mut self, wr: W) {
        self.wrs[self.len].write(wr);
        self.len += 1;
    }

    /// Position in this chunk of the WR the provider returned as `bad_wr`.
    /// A provider that returns no (or a foreign) pointer is taken to have
    /// posted nothing of the chunk.
    fn index_of(&self, bad: *const W) -> usize {
        let base = self.wrs.as_ptr() as usize;
        let size = std::mem::size_of::<W>();
        match (bad as usize).checked_sub(base) {
            Some(off) if off % size == 0 && off / size < self.len => off / size,
            _ => 0,
        }
    }
}

impl Chunk<ibv_send_wr> {
    /// Links the chunk and returns its head.
    fn link(&mut self) -> *mut ibv_send_wr {
        let head: *mut ibv_send_wr = self.wrs.as_mut_ptr().cast();
        for i in 0..self.len {
            // SAFETY: entries 0..len were written by push; i + 1 <= len
            // stays inside the array (one past the end when i + 1 == len is
            // not stored).
            unsafe {
                (*head.add(i)).next = if i + 1 < self.len {
                    head.add(i + 1)
                } else {
                    std::ptr::null_mut()
                }
            };
        }
        head
    }
}

impl Chunk<ibv_recv_wr> {
    /// Links the chunk and returns its head.
    fn link(&mut self) -> *mut ibv_recv_wr {
        let head: *mut ibv_recv_wr = self.wrs.as_mut_ptr().cast();
        for i in 0..self.len {
            // SAFETY: as for the send chunk.
            unsafe {
                (*head.add(i)).next = if i + 1 < self.len {
                    head.add(i + 1)
                } else {
                    std::ptr::null_mut()
                }
            };
        }
        head
    }
}

/// `EINVAL` for work request check failures.
fn invalid(verb: Verb, detail: String) -> Error {
    Error::new(verb, crate::verbs::ErrorKind::InvalidArgument, detail)
}

/// `ENOMEM` for a work request that does not fit in its (full) queue.
fn queue_full(verb: Verb, queue: &str, capacity: usize) -> Error {
    Error::new(
        verb,
        crate::verbs::ErrorKind::NoMemory,
        format!("the {queue} queue is full ({capacity} work requests outstanding)"),
    )
}

/// What posting to a send queue needs to know of its QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendTarget {
    /// Transport.
    pub(crate) qp_type: QpType,
    /// Granted scatter length.
    pub(crate) max_send_sge: u32,
    /// Granted inline room.
    pub(crate) max_inline_data: u32,
    /// Every send work request is signaled (`sq_sig_all`).
    pub(crate) sig_all: bool,
}

/// Converts one send WR into `chunk`, entering the objects it names in
/// `held`. Returns the window to update if it is a BIND_MW.
fn fill_send<'a>(
    qp: &SendTarget,
    wr: &SendWr<'a>,
    chunk: &mut Chunk<ibv_send_wr>,
    held: &mut HeldSet<'a, HOLD>,
) -> Result<Option<(&'a HwMw, u32)>, Error> {
    let opcode = send_opcode_checked(qp, wr)?;
    let mut w: ibv_send_wr = zeroed();
    w.wr_id = wr.wr_id;
    w.opcode = opcode;
    w.send_flags = convert::send_flags_to_raw(wr.send_flags);
    let mut bound = None;
    match wr.op {
        SendOp::Send | SendOp::LocalInv { .. } | SendOp::SendWithInv { .. } | SendOp::SendWithImm { .. } => {}
        SendOp::Write { remote } | SendOp::WriteWithImm { remote, .. } | SendOp::Read { remote } => {
            w.wr.rdma = rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::CompareSwap { remote, compare, swap } => {
            w.wr.atomic = atomic_t {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
        }
        SendOp::FetchAdd { remote, add } => {
            w.wr.atomic = atomic_t {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            };
        }
        SendOp::BindMw { mw, rkey, bind } => {
            let hw_mw = super::downcast::<HwMw, _>(mw.ops()).ok_or_else(|| {
                verr!(
                    PostSend,
                    InvalidArgument,
                    "the memory window belongs to another backend"
                )
            })?;
            if hw_mw.mw_type() != crate::verbs::MwType::Type2 {
                return Err(verr!(
                    PostSend,
                    InvalidArgument,
                    "a type 1 window is bound with Qp::bind_mw, not a BIND_MW work request"
                ));
            }
            let hw_mr = super::downcast::<HwMr, _>(bind.mr.ops())
                .ok_or_else(|| verr!(PostSend, InvalidArgument, "the MR belongs to another backend"))?;
            if held.room() < 2 || !held.hold(hw_mw.obj().lifecycle()) {
                return Err(hw_mw.obj().destroyed_error(Verb::PostSend));
            }
            if !held.hold(hw_mr.obj().lifecycle()) {
                return Err(hw_mr.obj().destroyed_error(Verb::PostSend));
            }
            w.bind_mw_tso_union.bind_mw = bind_mw_t {
                mw: hw_mw.obj().raw(),
                rkey,
                bind_info: ibv_mw_bind_info {
                    mr: hw_mr.obj().raw(),
                    addr: bind.addr,
                    length: bind.length,
                    mw_access_flags: convert::access_to_raw(bind.access),
                },
            };
            bound = Some((hw_mw, rkey));
        }
        SendOp::RegMr { .. } => unreachable!("rejected by send_opcode_checked"),
    }
    match wr.op {
        SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } => {
            w.imm_data_invalidated_rkey_union.imm_data = convert::imm_to_raw(imm);
        }
        SendOp::SendWithInv { rkey } => w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey,
        SendOp::LocalInv { key } => w.imm_data_invalidated_rkey_union.invalidated_rkey = key,
        _ => {}
    }
    // (`check_send_wr` refused a UD send without a destination.)
    if let (QpType::Ud, Some(dest)) = (qp.qp_type, wr.ud) {
        let ah = super::downcast::<HwAh, _>(dest.ah.ops()).ok_or_else(|| {
            verr!(
                PostSend,
                InvalidArgument,
                "the address handle belongs to another backend"
            )
        })?;
        if !held.hold(ah.obj().lifecycle()) {
            return Err(ah.obj().destroyed_error(Verb::PostSend));
        }
        w.wr.ud = ud_t {
            ah: ah.obj().raw(),
            remote_qpn: dest.remote_qpn,
            remote_qkey: dest.remote_qkey,
        };
    }
    let (sg_list, num_sge) = chunk.sgl(wr.sg_list);
    w.sg_list = sg_list;
    w.num_sge = num_sge;
    chunk.push(w);
    Ok(bound)
}

/// The checks made before a send WR reaches the provider (the rules every
/// backend keeps, [`check_send_wr`]); its opcode.
fn send_opcode_checked(qp: &SendTarget, wr: &SendWr<'_>) -> Result<u32, Error> {
    let opcode = convert::send_opcode(&wr.op).ok_or_else(|| {
        verr!(
            PostSend,
            NotSupported,
            "user-space ibverbs has no REG_MR work request (fast registration exists only in kernel verbs)"
        )
    })?;
    let limits = SendLimits {
        qp_type: qp.qp_type,
        max_send_sge: qp.max_send_sge,
        max_inline_data: qp.max_inline_data,
        // The device checks the port's limit.
        max_msg_sz: None,
    };
    check_send_wr(wr, &limits).map_err(SendWrFault::error)?;
    Ok(opcode)
}

/// `ibv_post_send` for `wrs` on a QP described by `target`: `call` is the
/// provider call on the live (entered) QP; `shadow`, the send queue's ring.
pub(crate) fn post_send(
    target: &SendTarget,
    mut shadow: Option<&mut Producer<'_>>,
    wrs: &[SendWr<'_>],
    mut call: impl FnMut(*mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32,
) -> Result<(), PostError> {
    let mut start = 0;
    while start < wrs.len() {
        let mut chunk = Chunk::<ibv_send_wr>::new();
        let mut held = HeldSet::<HOLD>::new();
        let mut binds: [Option<(&HwMw, u32)>; WR_CHUNK] = [None; WR_CHUNK];
        let room = shadow.as_deref().map_or(usize::MAX, Producer::room);
        let mut rejected = None;
        let mut next = start;
        while next < wrs.len() && !chunk.full_for(wrs[next].sg_list.len()) {
            if chunk.len == room {
                let capacity = shadow.as_deref().map_or(0, |p| p.capacity());
                rejected = Some(queue_full(Verb::PostSend, "send", capacity));
                break;
            }
            let slot = chunk.len;
            let wr = &wrs[next];
            match fill_send(target, wr, &mut chunk, &mut held) {
                Ok(bound) => {
                    binds[slot] = bound;
                    if let Some(p) = shadow.as_deref_mut() {
                        let signaled = target.sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
                        p.push(wr.wr_id, wr.op.wc_opcode(), signaled);
                    }
                }
                Err(e) => {
                    rejected = Some(e);
                    break;
                }
            }
            next += 1;
        }
        if chunk.len > 0 {
            let head = chunk.link();
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            if let Some(p) = shadow.as_deref() {
                p.publish();
            }
            // The chain: chunk.len fully written WRs whose scatter lists,
            // AHs, windows and MRs are valid for the call (pool/spill on our
            // stack or heap; objects held entered).
            let rc = call(head, &mut bad);
            let posted = if rc == 0 { chunk.len } else { chunk.index_of(bad) };
            if let Some(p) = shadow.as_deref_mut() {
                p.settle(posted);
            }
            for (mw, rkey) in binds[..posted].iter().flatten() {
                mw.set_rkey(*rkey);
            }
            if rc != 0 {
                return Err(PostError {
                    index: start + posted,
                    error: ibv_error(Verb::PostSend, "ibv_post_send", rc),
                });
            }
        }
        if let Some(error) = rejected {
            return Err(PostError { index: next, error });
        }
        start = next;
    }
    Ok(())
}

/// `ibv_post_recv` / `ibv_post_srq_recv` for `wrs`: `post` is the provider
/// call on a live (entered) queue, `max_sge` its granted scatter length,
/// `shadow` its ring (a QP's receive queue; an SRQ has none).
pub(crate) fn post_recv(
    wrs: &[RecvWr<'_>],
    max_sge: u32,
    verb: Verb,
    call: &str,
    mut shadow: Option<&mut Producer<'_>>,
    mut post: impl FnMut(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> Result<(), PostError> {
    let mut start = 0;
    while start < wrs.len() {
        let mut chunk = Chunk::<ibv_recv_wr>::new();
        let room = shadow.as_deref().map_or(usize::MAX, Producer::room);
        let mut rejected = None;
        let mut next = start;
        while next < wrs.len() && !chunk.full_for(wrs[next].sg_list.len()) {
            let wr = &wrs[next];
            if chunk.len == room {
                let capacity = shadow.as_deref().map_or(0, |p| p.capacity());
                rejected = Some(queue_full(verb, "receive", capacity));
                break;
            }
            if wr.sg_list.len() > max_sge as usize {
                rejected = Some(invalid(
                    verb,
                    format!("{} SGEs exceed the queue's max_sge of {max_sge}", wr.sg_list.len()),
                ));
                break;
            }
            if wr.sg_list.iter().any(Sge::is_inline_only) {
                rejected = Some(invalid(
                    verb,
                    "a receive cannot scatter into Sge::inline memory (it has no lkey)".to_string(),
                ));
                break;
            }
            let (sg_list, num_sge) = chunk.sgl(wr.sg_list);
            chunk.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                sg_list,
                num_sge,
            });
            if let Some(p) = shadow.as_deref_mut() {
                p.push(wr.wr_id, WcOpcode::Recv, true);
            }
            next += 1;
        }
        if chunk.len > 0 {
            let head = chunk.link();
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            if let Some(p) = shadow.as_deref() {
                p.publish();
            }
            let rc = post(head, &mut bad);
            let posted = if rc == 0 { chunk.len } else { chunk.index_of(bad) };
            if let Some(p) = shadow.as_deref_mut() {
                p.settle(posted);
            }
            if rc != 0 {
                return Err(PostError {
                    index: start + posted,
                    error: ibv_error(verb, call, rc),
                });
            }
        }
        if let Some(error) = rejected {
            return Err(PostError { index: next, error });
        }
        start = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One receive WR as the provider saw it: wr_id and (addr, length,
    /// lkey) of each SGE.
    type Seen = (u64, Vec<(u64, u32, u32)>);

    /// Walks a chain the way a provider does, recording what it holds.
    fn recv_chain(head: *mut ibv_recv_wr) -> Vec<Seen> {
        let mut out = Vec::new();
        let mut p = head;
        while !p.is_null() {
            // SAFETY: the chain post_recv built; valid for this call.
            let wr = unsafe { &*p };
            let sges = (0..wr.num_sge as usize)
                // SAFETY: num_sge entries at sg_list.
                .map(|i| unsafe { *wr.sg_list.add(i) })
                .map(|s| (s.addr, s.length, s.lkey))
                .collect();
            out.push((wr.wr_id, sges));
            p = wr.next;
        }
        out
    }

    fn sges(n: usize) -> Vec<Sge<'static>> {
        // SAFETY: never dereferenced: the fake provider only reads numbers.
        (0..n)
            .map(|i| unsafe { Sge::from_raw(0x1000 * i as u64, 64, 7) })
            .collect()
    }

    #[test]
    fn recv_chains_are_chunked_and_linked() {
        let lists: Vec<Vec<Sge<'static>>> = (0..40).map(|i| sges(1 + i % 3)).collect();
        let wrs: Vec<RecvWr<'_>> = lists
            .iter()
            .enumerate()
            .map(|(i, l)| RecvWr::new(i as u64, l))
            .collect();
        let mut calls = Vec::new();
        post_recv(&wrs, 3, Verb::PostRecv, "fake", None, |head, _bad| {
            calls.push(recv_chain(head));
            0
        })
        .unwrap();
        assert!(calls.iter().all(|c| c.len() <= WR_CHUNK));
        let flat: Vec<_> = calls.concat();
        assert_eq!(flat.len(), 40);
        for (i, (id, s)) in flat.iter().enumerate() {
            assert_eq!(*id, i as u64);
            assert_eq!(s.len(), 1 + i % 3);
            assert_eq!(s[0], (0, 64, 7));
        }
    }

    #[test]
    fn bad_wr_maps_back_to_the_slice_index() {
        let list = sges(1);
        let wrs: Vec<RecvWr<'_>> = (0..20).map(|i| RecvWr::new(i, &list)).collect();
        // The provider rejects the 4th WR of the second chunk.
        let mut call = 0;
        let err = post_recv(&wrs, 1, Verb::PostRecv, "fake", None, |head, bad| {
            call += 1;
            if call == 2 {
                // SAFETY: the chain has at least 4 entries.
                unsafe { *bad = (*(*(*head).next).next).next };
                libc::ENOMEM
            } else {
                0
            }
        })
        .unwrap_err();
        assert_eq!(err.index, WR_CHUNK + 3);
        assert_eq!(err.error.kind(), crate::verbs::ErrorKind::NoMemory);
    }

    #[test]
    fn invalid_wrs_post_those_before_them() {
        let ok = sges(1);
        let too_long = sges(5);
        let data = [1u8; 4];
        let inline = [Sge::inline(&data)];
        let mut wrs: Vec<RecvWr<'_>> = (0..5).map(|i| RecvWr::new(i, &ok)).collect();
        wrs.push(RecvWr::new(5, &too_long));
        let mut posted = 0;
        let err = post_recv(&wrs, 4, Verb::PostSrqRecv, "fake", None, |head, _| {
            posted += recv_chain(head).len();
            0
        })
        .unwrap_err();
        assert_eq!((err.index, posted), (5, 5));
        assert_eq!(err.error.verb(), Verb::PostSrqRecv);
        wrs[5] = RecvWr::new(5, &inline);
        let err = post_recv(&wrs, 4, Verb::PostRecv, "fake", None, |_, _| 0).unwrap_err();
        assert_eq!(err.index, 5);
        assert!(err.error.detail().contains("inline"));
    }

    #[test]
    fn long_scatter_lists_spill_and_pools_split_chunks() {
        let big = sges(SGE_POOL + 3);
        let mid = sges(SGE_POOL / 2 + 1);
        let wrs = [
            RecvWr::new(0, &mid),
            RecvWr::new(1, &big),
            RecvWr::new(2, &mid),
            RecvWr::new(3, &mid),
        ];
        let mut calls = Vec::new();
        post_recv(&wrs, u32::MAX, Verb::PostRecv, "fake", None, |head, _| {
            calls.push(recv_chain(head));
            0
        })
        .unwrap();
        let shape: Vec<Vec<usize>> = calls.iter().map(|c| c.iter().map(|(_, s)| s.len()).collect()).collect();
        let m = SGE_POOL / 2 + 1;
        assert_eq!(shape, vec![vec![m], vec![SGE_POOL + 3], vec![m], vec![m]]);
        assert_eq!(calls[1][0].1[SGE_POOL + 2], (0x1000 * (SGE_POOL as u64 + 2), 64, 7));
    }

    #[test]
    fn empty_batches_call_nothing() {
        post_recv(&[], 1, Verb::PostRecv, "fake", None, |_, _| unreachable!()).unwrap();
    }
}
