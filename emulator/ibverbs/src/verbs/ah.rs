//! Address handles, also from a received work completion.

use super::*;

/// `ibv_create_ah`.
///
/// # Safety
///
/// `pd` a live PD; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    null_check!(null_mut(); pd, attr);
    // SAFETY: readable per the contract.
    let a = ah_from(unsafe { &*attr });
    // SAFETY: a live PD.
    match unsafe { &(*(pd as *mut SvPd)).h }.create_ah(&a) {
        Ok(h) => {
            let p = into_raw(SvAh {
                ah: ibv_ah {
                    // SAFETY: a live PD.
                    context: unsafe { (*pd).context },
                    pd,
                    handle: 0,
                },
                h,
            });
            // SAFETY: just allocated.
            unsafe { &mut (*p).ah }
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_destroy_ah`.
///
/// # Safety
///
/// `ah` NULL or a live AH.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    null_check!(libc::EINVAL; ah);
    // SAFETY: a live AH of this library.
    unsafe { destroy_then_free(ah as *mut SvAh, |a| a.h.ops().destroy()) }
}

/// `struct ibv_grh` (40 bytes in front of a UD receive).
#[repr(C)]
struct IbvGrh {
    version_tclass_flow: u32,
    paylen: u16,
    next_hdr: u8,
    hop_limit: u8,
    sgid: [u8; 16],
    dgid: [u8; 16],
}

/// `ibv_init_ah_from_wc`: the address vector that answers a UD receive
/// (its GRH gives the peer's GID on RoCE).
///
/// # Safety
///
/// `ctx` an open context; `wc` readable; `grh` readable for 40 bytes when
/// the completion has `IBV_WC_GRH`; `ah_attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    null_check!(-1; ctx, wc, ah_attr);
    // SAFETY: per the contract.
    let (w, out) = unsafe { (&*wc, &mut *ah_attr) };
    *out = ibv_ah_attr::default();
    out.dlid = w.slid;
    out.sl = w.sl;
    out.src_path_bits = w.dlid_path_bits;
    out.port_num = port;
    if w.wc_flags & 1 == 0 || grh.is_null() {
        // RoCE needs the GRH to answer.
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: 40 readable bytes per the contract (read unaligned).
    let mut g: IbvGrh = unsafe { std::ptr::read_unaligned(grh as *const IbvGrh) };
    // SAFETY: as above, the same 40 bytes.
    let raw: [u8; 40] = unsafe { std::ptr::read_unaligned(grh as *const [u8; 40]) };
    if raw[0] >> 4 != 6 && raw[20] == 0x45 {
        // RoCEv2 over IPv4 (as rdma-core reads it): the IPv4 header in
        // the last 20 bytes; the GIDs are the IPv4-mapped addresses.
        let mapped = |a: &[u8]| {
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(a);
            gid
        };
        g.sgid = mapped(&raw[32..36]);
        g.dgid = mapped(&raw[36..40]);
        g.version_tclass_flow = (6u32 << 28 | u32::from(raw[21]) << 20).to_be();
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let len = sv.ctx.query_port(port).map(|p| p.gid_tbl_len).unwrap_or(0);
    let Some(idx) = (0..len).find(|&i| sv.ctx.query_gid(port, i).ok() == Some(Gid(g.dgid))) else {
        set_errno(libc::ENOENT);
        return -1;
    };
    let flow = u32::from_be(g.version_tclass_flow);
    out.is_global = 1;
    out.grh.dgid = ibv_gid { raw: g.sgid };
    out.grh.sgid_index = idx as u8;
    out.grh.flow_label = flow & 0xfffff;
    out.grh.hop_limit = 0xff;
    out.grh.traffic_class = ((flow >> 20) & 0xff) as u8;
    0
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
///
/// As `ibv_init_ah_from_wc`, and `pd` a live PD.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port: u8,
) -> *mut ibv_ah {
    null_check!(null_mut(); pd);
    let mut a = ibv_ah_attr::default();
    // SAFETY: forwarded contract.
    if unsafe { __softverbs_ibv_init_ah_from_wc((*pd).context, port, wc, grh, &mut a) } != 0 {
        return null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { __softverbs_ibv_create_ah(pd, &mut a) }
}
