//! The extended CQ (`ibv_create_cq_ex`, `ibv_start_poll` …) and QP
//! (`ibv_create_qp_ex`, `ibv_wr_*`) interfaces.

use std::ffi::c_void;
use std::os::raw::{c_int, c_uint};
use std::ptr::null_mut;

use softverbs::verbs::WorkCompletion;

use crate::ffi::*;
use crate::objects::*;

// ---------------------------------------------------------------- CQ

/// `verbs_context::create_cq_ex`: the work-completion fields of
/// `IBV_CREATE_CQ_SUP_WC_FLAGS` up to `IBV_WC_EX_WITH_DLID_PATH_BITS`;
/// timestamps, CVLAN, flow tags and tag matching are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_cq_ex(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    if ctx.is_null() || attr.is_null() {
        crate::objects::set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: readable per the verb's contract.
    let a = unsafe { &*attr };
    if a.wc_flags & !IBV_CREATE_CQ_SUP_WC_FLAGS != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0
        || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null())
    {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if a.cqe > i32::MAX as u32 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe {
        crate::verbs::create_cq_common(ctx, a.cqe as c_int, a.cq_context, a.channel, a.comp_vector as c_int)
            as *mut ibv_cq_ex
    }
}

fn cur(cq: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: called only between a successful start_poll and end_poll on
    // a live CQ of this library.
    let c = unsafe { SvCq::from_ibv(cq as *mut ibv_cq) };
    let g = c.ex.lock().unwrap_or_else(|e| e.into_inner());
    g.wc[g.i.min(EX_BATCH - 1)]
}

fn publish(cq: *mut ibv_cq_ex, w: &WorkCompletion) {
    // SAFETY: a live CQ; the application reads these fields after the
    // poll call returns.
    unsafe {
        (*cq).wr_id = w.wr_id;
        (*cq).status = w.status.as_raw();
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: `attr` readable per the verb's contract.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ of this library.
    let c = unsafe { SvCq::from_ibv(cq as *mut ibv_cq) };
    crate::state::POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut g = c.ex.lock().unwrap_or_else(|e| e.into_inner());
    let n = match c.h.poll(&mut g.wc) {
        Ok(n) => n,
        Err(e) => return e.errno(),
    };
    if n == 0 {
        return libc::ENOENT;
    }
    g.n = n;
    g.i = 0;
    let w = g.wc[0];
    drop(g);
    crate::state::note_completions();
    publish(cq, &w);
    0
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ of this library.
    let c = unsafe { SvCq::from_ibv(cq as *mut ibv_cq) };
    let mut g = c.ex.lock().unwrap_or_else(|e| e.into_inner());
    if g.i + 1 < g.n {
        g.i += 1;
    } else {
        let n = match c.h.poll(&mut g.wc) {
            Ok(n) => n,
            Err(e) => return e.errno(),
        };
        if n == 0 {
            return libc::ENOENT;
        }
        g.n = n;
        g.i = 0;
        crate::state::note_completions();
    }
    let w = g.wc[g.i];
    drop(g);
    publish(cq, &w);
    0
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_uint {
    cur(cq).opcode.as_raw()
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    crate::data::wc_to_c(&cur(cq)).imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    cur(cq).wc_flags.bits()
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    u32::from(cur(cq).slid)
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).dlid_path_bits
}

/// Fills the polling functions of a new CQ.
pub(crate) fn install_cq_ex_ops(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_dlid_path_bits);
}

// ---------------------------------------------------------------- QP

/// `IBV_SEND_INLINE` of `enum ibv_send_flags`.
const IBV_SEND_INLINE: u32 = 1 << 3;

/// The `send_ops_flags` this library's `ibv_wr_*` API implements.
const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV;

/// `verbs_context::create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    if ctx.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: readable and writable per the verb's contract.
    let a = unsafe { &mut *attr };
    let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & !known != 0 || a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        // XRC domains, RSS, TSO, … are not offered; a QP needs a PD.
        set_errno(if a.comp_mask & !known != 0 {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
        return null_mut();
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    // SAFETY: forwarded contract.
    let q = unsafe {
        crate::verbs::create_qp_common(
            a.pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
        )
    };
    if !q.is_null() {
        // SAFETY: just created.
        unsafe { (*q).qp.comp_mask = 0 };
    }
    q as *mut ibv_qp
}

fn with_batch<R>(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut ExBatch, &ibv_qp_ex) -> R) -> R {
    // SAFETY: a live QP of this library (the ibv_wr_* contract).
    let q = unsafe { SvQp::from_ibv(qp as *mut ibv_qp) };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: as above; wr_id and wr_flags are read at builder calls.
    f(&mut b, unsafe { &*qp })
}

fn new_wr(qp: *mut ibv_qp_ex, opcode: u32, fill: impl FnOnce(&mut ExWr)) {
    with_batch(qp, |b, q| {
        let mut w = ExWr {
            wr_id: q.wr_id,
            flags: q.wr_flags,
            opcode,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ah: null_mut(),
            remote_qpn: 0,
            remote_qkey: 0,
            mw: null_mut(),
            bind: None,
            sge_start: b.sges.len(),
            sge_len: 0,
            inline: false,
        };
        fill(&mut w);
        b.wrs.push(w);
    })
}

fn last_wr(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut ExWr, &mut Vec<ibv_sge>, &mut Vec<Vec<u8>>)) {
    with_batch(qp, |b, _| {
        let ExBatch {
            wrs,
            sges,
            inline,
            error,
        } = b;
        match wrs.last_mut() {
            Some(w) => f(w, sges, inline),
            // A setter without an opcode call before it.
            None => *error = libc::EINVAL,
        }
    })
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_batch(qp, |b, _| *b = ExBatch::default());
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_batch(qp, |b, _| *b = ExBatch::default());
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    new_wr(qp, IBV_WR_SEND, |_| {});
}
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    new_wr(qp, IBV_WR_SEND_WITH_IMM, |w| w.imm = imm);
}
unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    new_wr(qp, IBV_WR_SEND_WITH_INV, |w| w.imm = rkey);
}
unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    new_wr(qp, IBV_WR_RDMA_WRITE, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    });
}
unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    new_wr(qp, IBV_WR_RDMA_WRITE_WITH_IMM, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.imm = imm;
    });
}
unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    new_wr(qp, IBV_WR_RDMA_READ, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    });
}
unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, compare: u64, swap: u64) {
    new_wr(qp, IBV_WR_ATOMIC_CMP_AND_SWP, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.compare_add = compare;
        w.swap = swap;
    });
}
unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    new_wr(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.compare_add = add;
    });
}
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    new_wr(qp, IBV_WR_LOCAL_INV, |w| w.imm = rkey);
}
unsafe extern "C" fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    // SAFETY: `info` readable per the verb's contract (checked for NULL).
    let bind = if info.is_null() { None } else { Some(unsafe { *info }) };
    new_wr(qp, IBV_WR_BIND_MW, |w| {
        w.mw = mw;
        w.rkey = rkey;
        w.bind = bind;
    });
}
unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    last_wr(qp, |w, _, _| {
        w.ah = ah;
        w.remote_qpn = qpn;
        w.remote_qkey = qkey;
    });
}
unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last_wr(qp, |w, sges, _| {
        w.sge_start = sges.len();
        w.sge_len = 1;
        w.inline = false;
        sges.push(ibv_sge { addr, length, lkey });
    });
}
unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last_wr(qp, |w, sges, _| {
        w.sge_start = sges.len();
        w.sge_len = n;
        w.inline = false;
        if n > 0 && !list.is_null() {
            // SAFETY: readable for n entries per the verb's contract.
            sges.extend_from_slice(unsafe { std::slice::from_raw_parts(list, n) });
        } else {
            w.sge_len = 0;
        }
    });
}
unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let d = ibv_data_buf { addr, length };
    // SAFETY: one readable entry.
    unsafe { wr_set_inline_data_list(qp, 1, &d) };
}
unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, n: usize, bufs: *const ibv_data_buf) {
    let mut data = Vec::new();
    if n > 0 && !bufs.is_null() {
        // SAFETY: readable for n entries, each buffer readable for its
        // length during this call (the API copies inline data here).
        for b in unsafe { std::slice::from_raw_parts(bufs, n) } {
            if b.length > 0 && !b.addr.is_null() {
                // SAFETY: as above, this buffer is readable for its length.
                data.extend_from_slice(unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.length) });
            }
        }
    }
    last_wr(qp, |w, _, inline| {
        w.inline = true;
        w.sge_start = inline.len();
        w.sge_len = 1;
        inline.push(data);
    });
}

/// `ibv_wr_complete`: posts the batch built since `ibv_wr_start` as one
/// unit, as `ibv_post_send` posts a chain (so an error of an early work
/// request flushes the later ones before the receive queue). A batch with
/// any work request that cannot be posted (a setter without an operation,
/// an operation the QP type does not take, too many SGEs, inline data
/// over `max_inline_data`, a message over the path MTU or `max_msg_sz`,
/// more work requests than the send queue has room for, …) fails with
/// its errno and posts none of them, as the verbs contract asks: the
/// provider checks the whole batch before it queues any of it
/// ([`softverbs::verbs::Qp::post_send_all`]).
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    let b = with_batch(qp, |b, _| std::mem::take(b));
    if b.error != 0 {
        return b.error;
    }
    if b.wrs.is_empty() {
        return 0;
    }
    // SAFETY: a live QP of this library (the ibv_wr_* contract).
    let q = unsafe { SvQp::from_ibv(qp as *mut ibv_qp) };
    // Each work request's scatter/gather list, built before the requests
    // so that their pointers stay put.
    let mut sgls: Vec<Vec<ibv_sge>> = b
        .wrs
        .iter()
        .map(|w| {
            if w.inline {
                let d = &b.inline[w.sge_start];
                vec![ibv_sge {
                    addr: d.as_ptr() as u64,
                    length: d.len() as u32,
                    lkey: 0,
                }]
            } else {
                b.sges[w.sge_start..w.sge_start + w.sge_len].to_vec()
            }
        })
        .collect();
    let mut chain: Vec<ibv_send_wr> = Vec::with_capacity(b.wrs.len());
    for (w, sges) in b.wrs.iter().zip(&mut sgls) {
        // SAFETY: plain data, all-zero is valid (NULL pointers).
        let mut c: ibv_send_wr = unsafe { std::mem::zeroed() };
        c.wr_id = w.wr_id;
        c.sg_list = if sges.is_empty() { null_mut() } else { sges.as_mut_ptr() };
        c.num_sge = sges.len() as c_int;
        c.opcode = w.opcode;
        c.send_flags = w.flags | if w.inline { IBV_SEND_INLINE } else { 0 };
        c.imm_data = w.imm;
        match w.opcode {
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
                c.wr.atomic = wr_atomic {
                    remote_addr: w.remote_addr,
                    compare_add: w.compare_add,
                    swap: w.swap,
                    rkey: w.rkey,
                }
            }
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV if !w.ah.is_null() => {
                c.wr.ud = wr_ud {
                    ah: w.ah,
                    remote_qpn: w.remote_qpn,
                    remote_qkey: w.remote_qkey,
                }
            }
            IBV_WR_BIND_MW => {
                if let Some(info) = w.bind {
                    c.ext.bind_mw = wr_bind_mw {
                        mw: w.mw,
                        rkey: w.rkey,
                        bind_info: info,
                    }
                }
            }
            _ => {
                c.wr.rdma = wr_rdma {
                    remote_addr: w.remote_addr,
                    rkey: w.rkey,
                }
            }
        }
        chain.push(c);
    }
    // Linked only now: `chain` no longer moves.
    let base = chain.as_mut_ptr();
    for i in 1..chain.len() {
        // SAFETY: `i - 1` and `i` are in bounds of `chain`.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad = null_mut();
    // SAFETY: a well-formed chain over the caller's registered memory (or
    // inline data owned by `b`, alive for the call); all-or-nothing: a
    // work request the library cannot convert or the provider refuses
    // posts none.
    unsafe { crate::data::post_send_chain(q, qp as *mut ibv_qp, base, &mut bad, true) }
}

/// Fills the work-request builder functions of a new QP.
pub(crate) fn install_qp_ex_ops(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
}
