//! The data path: the functions of `ibv_context_ops` that the static
//! inline `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
//! `ibv_poll_cq`, `ibv_req_notify_cq` and `ibv_bind_mw` call.

use std::os::raw::c_int;

use softverbs::verbs::{
    AccessFlags, MwBindInfo, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcFlags, WorkCompletion,
};

use crate::ffi::*;
use crate::objects::*;

/// Scatter/gather entries kept on the stack for one work request.
const STACK_SGE: usize = 4;

/// Runs `f` with the entries of a C scatter list as softverbs entries.
///
/// # Safety
///
/// `list` readable for `n` entries (when `n > 0`); each entry's memory as
/// `ibv_post_send`/`ibv_post_recv` require it (registered under its lkey,
/// valid until the work request completes, or readable during the call
/// for inline data).
unsafe fn with_sges<R>(list: *const ibv_sge, n: c_int, f: impl FnOnce(&[Sge<'static>]) -> R) -> Result<R, c_int> {
    if n < 0 || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    let n = n as usize;
    // SAFETY: the caller's promise about each entry (see above).
    let conv = |e: &ibv_sge| unsafe { Sge::from_raw(e.addr, e.length, e.lkey) };
    let src = if n == 0 {
        &[][..]
    } else {
        // SAFETY: `list` is readable for `n` entries.
        unsafe { std::slice::from_raw_parts(list, n) }
    };
    if n <= STACK_SGE {
        // SAFETY: an empty entry, never read (only the first n are used).
        let mut buf = [unsafe { Sge::from_raw(0, 0, 0) }; STACK_SGE];
        for (d, s) in buf.iter_mut().zip(src) {
            *d = conv(s);
        }
        Ok(f(&buf[..n]))
    } else {
        let v: Vec<Sge<'static>> = src.iter().map(conv).collect();
        Ok(f(&v))
    }
}

/// The operation of a C send work request.
///
/// # Safety
///
/// `wr` readable; the AH, MW and MR it names live objects of this library.
unsafe fn send_op(wr: &ibv_send_wr) -> Result<SendOp<'static>, c_int> {
    // SAFETY: reading the union member the opcode selects.
    unsafe {
        let rdma = || RemoteAddr {
            addr: wr.wr.rdma.remote_addr,
            rkey: wr.wr.rdma.rkey,
        };
        let atomic = || RemoteAddr {
            addr: wr.wr.atomic.remote_addr,
            rkey: wr.wr.atomic.rkey,
        };
        Ok(match wr.opcode {
            IBV_WR_SEND => SendOp::Send,
            IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm {
                imm: u32::from_be(wr.imm_data),
            },
            IBV_WR_SEND_WITH_INV => SendOp::SendWithInv { rkey: wr.imm_data },
            IBV_WR_RDMA_WRITE => SendOp::Write { remote: rdma() },
            IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
                remote: rdma(),
                imm: u32::from_be(wr.imm_data),
            },
            IBV_WR_RDMA_READ => SendOp::Read { remote: rdma() },
            IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote: atomic(),
                compare: wr.wr.atomic.compare_add,
                swap: wr.wr.atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote: atomic(),
                add: wr.wr.atomic.compare_add,
            },
            IBV_WR_LOCAL_INV => SendOp::LocalInv { key: wr.imm_data },
            IBV_WR_BIND_MW => {
                let b = wr.ext.bind_mw;
                if b.mw.is_null() || b.bind_info.mr.is_null() {
                    return Err(libc::EINVAL);
                }
                let mw = &(*(b.mw as *mut SvMw)).h;
                let mr = &(*(b.bind_info.mr as *mut SvMr)).h;
                SendOp::BindMw {
                    mw,
                    rkey: b.rkey,
                    bind: MwBindInfo {
                        mr,
                        addr: b.bind_info.addr,
                        length: b.bind_info.length,
                        access: AccessFlags::from_bits_truncate(b.bind_info.mw_access_flags),
                    },
                }
            }
            // TSO, driver opcodes, ATOMIC_WRITE: not offered.
            _ => return Err(libc::EINVAL),
        })
    }
}

/// `ibv_post_send`: posts the chain in order; on the first rejected work
/// request stores it in `*bad_wr` and returns its errno (the ones before
/// it are posted, as with any provider).
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP of this library.
    let q = unsafe { SvQp::from_ibv(qp) };
    // SAFETY: the chain is readable (ibv_post_send's contract).
    if !wr.is_null() && !unsafe { (*wr).next }.is_null() {
        // SAFETY: forwarded contract.
        return unsafe { post_send_chain(q, qp, wr, bad_wr, false) };
    }
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the chain's work requests are readable (ibv_post_send's
        // contract); their AH/MW/MR pointers are live objects.
        let r = unsafe {
            let w = &*cur;
            match send_op(w) {
                Err(e) => Err(e),
                Ok(op) => {
                    let ud = if w.opcode <= IBV_WR_SEND_WITH_IMM && !w.wr.ud.ah.is_null() && (*qp).qp_type == 4 {
                        Some((&(*(w.wr.ud.ah as *mut SvAh)).h, w.wr.ud.remote_qpn, w.wr.ud.remote_qkey))
                    } else {
                        None
                    };
                    with_sges(w.sg_list, w.num_sge, |sgl| {
                        let mut s = SendWr::new(w.wr_id, op, sgl).flags(SendFlags::from_bits_truncate(w.send_flags));
                        if let Some((ah, qpn, qkey)) = ud {
                            s = s.ud(ah, qpn, qkey);
                        }
                        q.h.post_send(std::slice::from_ref(&s)).map_err(|e| e.error.errno())
                    })
                    .and_then(|r| r)
                }
            }
        };
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: writable per the contract.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        // SAFETY: readable, as above.
        cur = unsafe { (*cur).next };
    }
    0
}

/// `ibv_post_send` of a chain of more than one work request: the chain is
/// handed to the QP in one post, as a NIC sees a chain (the QP processes
/// it in order, so an error completion of the first work request flushes
/// the rest of the chain before the receive queue). Posting one at a time
/// would let the first one's error flush the receive queue before the
/// later work requests even reach the send queue. A work request the
/// library cannot convert ends the chain there: those before it are
/// posted, it is `*bad_wr`. With `all_or_nothing`, as `ibv_wr_complete`
/// needs, nothing is posted unless every work request can be
/// ([`softverbs::verbs::Qp::post_send_all`]).
///
/// # Safety
///
/// As [`post_send`].
pub(crate) unsafe fn post_send_chain(
    q: &SvQp,
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
    all_or_nothing: bool,
) -> c_int {
    let mut ptrs: Vec<*mut ibv_send_wr> = Vec::new();
    let mut ops = Vec::new();
    let mut sgls: Vec<Vec<Sge<'static>>> = Vec::new();
    let mut rejected = None;
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the chain's work requests are readable (ibv_post_send's
        // contract); their AH/MW/MR pointers are live objects; each entry's
        // memory as with_sges requires.
        let conv = unsafe {
            let w = &*cur;
            send_op(w).and_then(|op| with_sges(w.sg_list, w.num_sge, <[Sge<'static>]>::to_vec).map(|sgl| (op, sgl)))
        };
        match conv {
            Ok((op, sgl)) => {
                ptrs.push(cur);
                ops.push(op);
                sgls.push(sgl);
            }
            Err(e) => {
                rejected = Some((cur, e));
                break;
            }
        }
        // SAFETY: readable, as above.
        cur = unsafe { (*cur).next };
    }
    if let (true, Some((p, e))) = (all_or_nothing, rejected) {
        if !bad_wr.is_null() {
            // SAFETY: writable per the contract.
            unsafe { *bad_wr = p };
        }
        return e;
    }
    let mut wrs = Vec::with_capacity(ptrs.len());
    for ((&p, op), sgl) in ptrs.iter().zip(ops).zip(&sgls) {
        // SAFETY: readable, as above; a UD work request's AH is a live AH
        // of this library.
        unsafe {
            let w = &*p;
            let mut s = SendWr::new(w.wr_id, op, sgl).flags(SendFlags::from_bits_truncate(w.send_flags));
            if w.opcode <= IBV_WR_SEND_WITH_IMM && !w.wr.ud.ah.is_null() && (*qp).qp_type == 4 {
                s = s.ud(&(*(w.wr.ud.ah as *mut SvAh)).h, w.wr.ud.remote_qpn, w.wr.ud.remote_qkey);
            }
            wrs.push(s);
        }
    }
    let posted = if all_or_nothing {
        q.h.post_send_all(&wrs)
    } else {
        q.h.post_send(&wrs)
    };
    let (bad, errno) = match (posted, rejected) {
        (Err(e), _) => (ptrs[e.index], e.error.errno()),
        (Ok(()), Some((p, e))) => (p, e),
        (Ok(()), None) => return 0,
    };
    if !bad_wr.is_null() {
        // SAFETY: writable per the contract.
        unsafe { *bad_wr = bad };
    }
    errno
}

/// Posts a receive chain through `post` (a QP's or an SRQ's).
unsafe fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&RecvWr<'_>) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the chain is readable (ibv_post_recv's contract).
        let w = unsafe { &*cur };
        // SAFETY: each entry's memory is registered and stays valid until
        // the receive completes (ibv_post_recv's contract).
        let r = unsafe { with_sges(w.sg_list, w.num_sge, |sgl| post(&RecvWr::new(w.wr_id, sgl))) }.and_then(|r| r);
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: writable per the contract.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ibv_post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP of this library.
    let q = unsafe { SvQp::from_ibv(qp) };
    // SAFETY: forwarded contract.
    unsafe {
        post_recv_chain(wr, bad_wr, |r| {
            q.h.post_recv(std::slice::from_ref(r)).map_err(|e| e.error.errno())
        })
    }
}

/// `ibv_post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ of this library.
    let s = unsafe { &(*(srq as *mut SvSrq)).h };
    // SAFETY: forwarded contract.
    unsafe {
        post_recv_chain(wr, bad_wr, |r| {
            s.post_recv(std::slice::from_ref(r)).map_err(|e| e.error.errno())
        })
    }
}

/// A softverbs completion as `struct ibv_wc`.
pub(crate) fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    let imm = if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status.as_raw(),
        opcode: w.opcode.as_raw(),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// How many completions one provider poll fetches into the stack buffer.
const POLL_BATCH: usize = 16;

/// `ibv_poll_cq`: up to `n` completions, or a negative value on error.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if cq.is_null() || n < 0 || (n > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    // SAFETY: a live CQ of this library.
    let c = unsafe { SvCq::from_ibv(cq) };
    crate::state::note_poll();
    let want = n as usize;
    if want == 1 {
        // The busy-polling loop of most programs (perftest's latency
        // tests, the pingpongs): one completion, without filling the
        // batch buffer on every empty poll.
        let mut one = [WorkCompletion::default()];
        return match c.h.poll(&mut one) {
            Ok(1) => {
                // SAFETY: the caller's array holds at least one entry.
                unsafe { *wc = wc_to_c(&one[0]) };
                crate::state::note_completions();
                1
            }
            Ok(_) => 0,
            Err(e) => -e.errno(),
        };
    }
    POLL_BUF.with(|b| match b.try_borrow_mut() {
        // SAFETY: forwarded contract (`wc` holds `n` entries).
        Ok(mut buf) => unsafe { poll_into(c, want, wc, &mut buf) },
        // Not reachable (nothing calls back into poll_cq while it polls);
        // a buffer on the stack would do.
        Err(_) => {
            let mut buf = [WorkCompletion::default(); POLL_BATCH];
            // SAFETY: as above.
            unsafe { poll_into(c, want, wc, &mut buf) }
        }
    })
}

thread_local! {
    /// The batch buffer of `ibv_poll_cq`, per thread: a bandwidth test
    /// polls for up to 16 completions millions of times a second, and
    /// filling a fresh buffer on the stack each time (900 bytes) was a
    /// visible share of its time.
    static POLL_BUF: std::cell::RefCell<[WorkCompletion; POLL_BATCH]> =
        std::cell::RefCell::new([WorkCompletion::default(); POLL_BATCH]);
}

/// Polls up to `want` completions of `c` into `wc` through `buf`.
///
/// # Safety
///
/// `wc` writable for `want` entries.
unsafe fn poll_into(c: &SvCq, want: usize, wc: *mut ibv_wc, buf: &mut [WorkCompletion; POLL_BATCH]) -> c_int {
    let mut got = 0usize;
    while got < want {
        let ask = (want - got).min(POLL_BATCH);
        let k = match c.h.poll(&mut buf[..ask]) {
            Ok(k) => k,
            Err(e) if got == 0 => return -e.errno(),
            Err(_) => break,
        };
        for (i, w) in buf[..k].iter().enumerate() {
            // SAFETY: the caller's array holds `n` entries; got + i < n.
            unsafe { *wc.add(got + i) = wc_to_c(w) };
        }
        got += k;
        if k < ask {
            break;
        }
    }
    if got > 0 {
        crate::state::note_completions();
    }
    got as c_int
}

/// `ibv_req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ of this library.
    match unsafe { SvCq::from_ibv(cq) }.h.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

/// `ibv_bind_mw` (type 1 windows): posts the bind and stores the new rkey
/// in `mw->rkey`, as libibverbs does.
pub(crate) unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live objects of this library; `bind` readable.
    unsafe {
        let b = &*bind;
        if b.bind_info.mr.is_null() {
            return libc::EINVAL;
        }
        let q = SvQp::from_ibv(qp);
        let w = mw as *mut SvMw;
        let info = MwBindInfo {
            mr: &(*(b.bind_info.mr as *mut SvMr)).h,
            addr: b.bind_info.addr,
            length: b.bind_info.length,
            access: AccessFlags::from_bits_truncate(b.bind_info.mw_access_flags),
        };
        match q
            .h
            .bind_mw(&(*w).h, b.wr_id, &info, SendFlags::from_bits_truncate(b.send_flags))
        {
            Ok(rkey) => {
                (*mw).rkey = rkey;
                0
            }
            Err(e) => e.errno(),
        }
    }
}
