//! Helpers of the connection manager's hardware-backend tests that run
//! over softverbs' own libibverbs/librdmacm (`run_hw_tests.sh`): the
//! device's address, its subsystem and CM, and the library's exported
//! controls.
#![allow(dead_code, unreachable_pub)]

use std::ffi::{c_void, CStr};
use std::net::IpAddr;
use std::sync::Arc;

use softverbs::cm::{Cm, CmConfig};
use softverbs::subsystem::{Generation, HwFactory, NamespaceId, Subsystem, SubsystemConfig};

/// The first address of `SOFTVERBS_CM_HW_ADDRS` (the library device's),
/// if set.
///
/// # Panics
///
/// If it is set but does not start with an IP address.
pub fn hw_addr() -> Option<IpAddr> {
    let v = std::env::var("SOFTVERBS_CM_HW_ADDRS").ok()?;
    let first = v.split(',').next().unwrap_or("").trim();
    Some(first.parse().expect("SOFTVERBS_CM_HW_ADDRS: an IP address"))
}

/// A subsystem made with `cfg` holding the hardware device `name` in the
/// initial namespace, its generation, and a CM over it.
pub fn hw_cm(name: &str, cfg: SubsystemConfig) -> (Arc<Subsystem>, Generation, Cm) {
    let sub = Arc::new(Subsystem::new(cfg));
    sub.add_device(HwFactory::new(&sub, name), NamespaceId::INIT)
        .expect("add the library's device");
    let gen = sub.device(name).unwrap().generation();
    let cm = Cm::new(sub.clone(), CmConfig::default()).expect("cm");
    (sub, gen, cm)
}

/// The address of `symbol` in the libraries loaded, if one exports it
/// (softverbs' libibverbs exports its `softverbs_*` controls).
pub fn loaded_symbol(symbol: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_DEFAULT searches the objects already loaded; the name
    // is NUL-terminated.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
    (!p.is_null()).then_some(p)
}
