//! The rest of libibverbs' exported surface: printable names, rate
//! conversions, fork support, sysfs helpers, the verbs the soft provider
//! does not offer (`EOPNOTSUPP`), and the provider-private
//! `IBVERBS_PRIVATE_34` entry points that provider libraries linked with
//! libibverbs (libmlx5, libefa, librdmacm) need in order to load.

mod v1_0;

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int, c_uint};
use std::ptr::null_mut;

use softverbs::verbs::{EventType, PortState, WcStatus};

use crate::ffi::*;
use crate::objects::set_errno;

/// Returns a static NUL-terminated string for `s` (interned once).
fn cstr(s: &'static str) -> *const c_char {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static TABLE: Mutex<Option<HashMap<&'static str, &'static CStr>>> = Mutex::new(None);
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let map = t.get_or_insert_with(HashMap::new);
    map.entry(s)
        .or_insert_with(|| {
            let owned = std::ffi::CString::new(s).unwrap_or_default();
            Box::leak(owned.into_boxed_c_str())
        })
        .as_ptr()
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_wc_status_str(status: c_uint) -> *const c_char {
    cstr(WcStatus::from_raw(status).map_or("unknown", |s| s.name()))
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_event_type_str(ev: c_uint) -> *const c_char {
    cstr(EventType::from_raw(ev).map_or("unknown", |s| s.name()))
}

/// `ibv_port_state_str` (the rdma-core spellings).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_port_state_str(state: c_uint) -> *const c_char {
    cstr(match PortState::from_raw(state) {
        Some(s) => s.name(),
        None => "unknown",
    })
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_node_type_str(t: c_int) -> *const c_char {
    cstr(match t {
        1 => "InfiniBand channel adapter",
        2 => "InfiniBand switch",
        3 => "InfiniBand router",
        4 => "iWARP NIC",
        5 => "usNIC",
        6 => "usNIC UDP",
        7 => "unspecified",
        _ => "unknown",
    })
}

/// (`enum ibv_rate`, multiple of 2.5 Gb/s, Mb/s) for every defined rate.
const RATES: [(c_int, c_int, c_int); 22] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (7, 12, 30000),
    (8, 16, 40000),
    (9, 24, 60000),
    (10, 32, 80000),
    (4, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 20, 50000),
    (20, 160, 400000),
    (21, 240, 600000),
    (22, 320, 800000),
    (23, 480, 1200000),
];

/// `ibv_rate_to_mult`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn __softverbs_mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn __softverbs_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// `ibv_fork_init`: 0. The soft provider never pins pages, so a forked
/// child cannot corrupt registered memory of the parent.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_is_fork_initialized() -> c_uint {
    2
}

/// `ibv_dontfork_range`: 0 (nothing is pinned).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: 0 (nothing is pinned).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_get_sysfs_path`: the real sysfs mount (soft devices have no
/// entries there).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated,
/// trailing newline removed); the length, or -1.
///
/// # Safety
///
/// `dir`, `file` NUL-terminated; `buf` writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: NUL-terminated per the contract.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
    // SAFETY: forwarded contract.
    unsafe { read_into(&path, buf, size) }
}

/// Reads a file into a C buffer as `ibv_read_sysfs_file` does.
///
/// # Safety
///
/// `buf` writable for `size` (> 0) bytes.
unsafe fn read_into(path: &str, buf: *mut c_char, size: usize) -> c_int {
    match std::fs::read(path) {
        Ok(mut data) => {
            data.truncate(size - 1);
            if data.last() == Some(&b'\n') {
                data.pop();
            }
            // SAFETY: data.len() < size.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, data.len());
                *buf.add(data.len()) = 0;
            }
            data.len() as c_int
        }
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            -1
        }
    }
}

/// `ibv_read_ibdev_sysfs_file` (IBVERBS_PRIVATE_34): soft devices have no
/// sysfs directory: -ENOENT.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_read_ibdev_sysfs_file(_buf: *mut c_char, _size: usize, _fmt: *const c_char) -> c_int {
    -libc::ENOENT
}

/// `ibv_resolve_eth_l2_from_gid`: the soft link addresses peers by GID,
/// so there is no neighbour to resolve; it reports the MAC of the GID's
/// interface id (EUI-64 form for IPv6, zero otherwise) and no VLAN.
///
/// # Safety
///
/// `attr` readable; `mac` writable for 6 bytes; `vid` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_resolve_eth_l2_from_gid(
    ctx: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    if ctx.is_null() || attr.is_null() || mac.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: per the contract.
    unsafe {
        let g = (*attr).grh.dgid.raw;
        let m = [g[8] ^ 2, g[9], g[10], g[13], g[14], g[15]];
        std::ptr::copy_nonoverlapping(m.as_ptr(), mac, 6);
        if !vid.is_null() {
            *vid = 0xffff;
        }
    }
    0
}

/// `ibv_attach_mcast`: `EOPNOTSUPP` (no multicast on soft devices).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// `ibv_detach_mcast`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// `ibv_import_device`: `EOPNOTSUPP` (no shared command FD).
#[no_mangle]
pub extern "C" fn __softverbs_ibv_import_device(_fd: c_int) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// `ibv_import_pd`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_import_pd(_ctx: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// `ibv_import_mr`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// `ibv_import_dm`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_import_dm(_ctx: *mut ibv_context, _handle: u32) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// `ibv_unimport_pd`, `ibv_unimport_mr`, `ibv_unimport_dm`: nothing can
/// have been imported, so there is nothing to release.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_unimport(_obj: *mut c_void) {}

/// `ibv_query_ece`, `ibv_set_ece`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_ibv_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// `ibv_register_driver` and `verbs_register_driver_34`: provider
/// libraries call these from their constructors; this library loads no
/// drivers, so the registration is ignored.
#[no_mangle]
pub extern "C" fn __softverbs_register_driver(_a: *const c_void, _b: *const c_void) {}

/// The provider-interface entry points returning `int`
/// (`ibv_cmd_*`, `execute_ioctl`): `EOPNOTSUPP`. Only provider drivers
/// call them, and no driver is ever bound to a device here.
#[no_mangle]
pub extern "C" fn __softverbs_private_int() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// The provider-interface entry points returning a pointer
/// (`_verbs_init_and_alloc_context`, `verbs_open_device`): NULL with
/// `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn __softverbs_private_ptr() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// The provider-interface entry points returning nothing
/// (`verbs_init_cq`, `verbs_set_ops`, `verbs_uninit_context`,
/// `__verbs_log`).
#[no_mangle]
pub extern "C" fn __softverbs_private_void() {}

/// `__ioctl_final_num_attrs`: the attribute count unchanged.
#[no_mangle]
pub extern "C" fn __softverbs_ioctl_final_num_attrs(num: c_uint, _link: *mut c_void) -> c_uint {
    num
}

/// `ibv_copy_qp_attr_from_kern`, `ibv_copy_ah_attr_from_kern`,
/// `ibv_copy_path_rec_from_kern`, `ibv_copy_path_rec_to_kern`: kernel
/// uAPI conversions used by librdmacm's kernel CM path, which has no
/// kernel behind it here. They leave the destination untouched.
#[no_mangle]
pub extern "C" fn __softverbs_copy_kern(_dst: *mut c_void, _src: *const c_void) {}
