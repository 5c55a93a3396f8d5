//! The process's connection manager: made at the first `rdma_*` call
//! that needs it, over a subsystem that holds the library's own soft
//! device, with the device context and PD every id shares; and what the
//! library tells it of the device (removal, an address gone).

use std::ffi::CStr;
use std::net::IpAddr;
use std::os::raw::{c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

use softverbs::cm::{Cm, CmConfig};
use softverbs::soft::SoftDevice;
use softverbs::subsystem::{soft_plugged, DeviceFactory, HotplugDevice, NamespaceId, Subsystem};
use softverbs::verbs::{BackendKind, Mtu};

use super::*;
use crate::ffi::*;

/// Gives the connection manager's subsystem the library's existing soft
/// device (once: a removed device is not brought back).
struct Existing {
    name: String,
    dev: Mutex<Option<Arc<SoftDevice>>>,
}

impl DeviceFactory for Existing {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }

    fn instantiate(&self, _ns: NamespaceId) -> softverbs::verbs::Result<Arc<dyn HotplugDevice>> {
        match self.dev.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(d) => Ok(soft_plugged(d)),
            None => Err(softverbs::verbs::Error::new(
                softverbs::verbs::Verb::OpenDevice,
                softverbs::verbs::ErrorKind::NoDevice,
                "the library's device cannot be plugged twice",
            )),
        }
    }
}

/// The process's connection manager and the device context every id
/// shares.
pub(super) struct Global {
    pub(super) cm: Cm,
    /// `*mut ibv_context` of the library's device (never closed: ids and
    /// the application's objects made on it may outlive any one id).
    pub(super) ctx: usize,
    /// `*mut ibv_pd`: the context's shared PD.
    pub(super) pd: usize,
    /// The device's MTU (`enum ibv_mtu`) for path records.
    pub(super) mtu: u8,
}

/// The connection manager, made at the first `rdma_*` call that needs it.
static GLOBAL: OnceLock<Result<Global, c_int>> = OnceLock::new();

/// Tells the connection manager that the library's device `name` was
/// hot-unplugged (`softverbs_remove_device`): each id on it gets
/// `RDMA_CM_EVENT_DEVICE_REMOVAL` once, and its QP is flushed. Nothing to
/// do if no `rdma_*` call has made the connection manager.
pub(crate) fn device_removed(name: &str) {
    if let Some(Ok(g)) = GLOBAL.get() {
        let _ =
            g.cm.subsystem()
                .remove_device_within(name, std::time::Duration::from_secs(1));
    }
}

/// Reports that IP address `addr` (text, IPv4 or IPv6) was removed from
/// the network interface of the library's device `name`, as the kernel
/// hears of `ip addr del` or a bonding failover: each `rdma_cm_id` bound
/// or connected through that address on the device gets
/// `RDMA_CM_EVENT_ADDR_CHANGE` once, and later `rdma_bind_addr` and
/// `rdma_resolve_addr` calls no longer find the address. The device's GID
/// table is not changed. Returns 0 (also when the address was already
/// removed: nothing is delivered twice), or -1 with `errno` `EINVAL`
/// (NULL or unparsable argument) or `ENOENT` (no such device present).
///
/// # Safety
///
/// `name` and `addr` must be NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn softverbs_remove_addr(name: *const c_char, addr: *const c_char) -> c_int {
    if name.is_null() || addr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes NUL-terminated strings.
    let (name, addr) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(addr)) };
    let (Ok(name), Some(ip)) = (name.to_str(), addr.to_str().ok().and_then(|a| a.parse::<IpAddr>().ok())) else {
        return fail(libc::EINVAL);
    };
    let g = match global() {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    match g
        .cm
        .subsystem()
        .address_change(name, ip, softverbs::subsystem::AddressChange::Removed)
    {
        Ok(()) => 0,
        Err(_) => fail(libc::ENOENT),
    }
}

pub(super) fn global() -> Result<&'static Global, c_int> {
    GLOBAL
        .get_or_init(|| {
            let d = *crate::state::present_devices().first().ok_or(libc::ENODEV)?;
            let sub = Arc::new(Subsystem::new(Default::default()));
            let factory = Arc::new(Existing {
                name: d.soft.name().to_string(),
                dev: Mutex::new(Some(d.soft.clone())),
            });
            sub.add_device(factory, NamespaceId::INIT).map_err(|e| e.errno())?;
            let cm = Cm::new(
                sub,
                CmConfig {
                    consumer: "librdmacm".into(),
                    ..CmConfig::default()
                },
            )
            .map_err(|e| e.errno())?;
            if let Some(cap) = d.mtu_cap {
                // The device's interface carries smaller packets than the
                // soft port reports: paths through it use what fits.
                let mtu = match cap {
                    1 => Mtu::Mtu256,
                    2 => Mtu::Mtu512,
                    3 => Mtu::Mtu1024,
                    4 => Mtu::Mtu2048,
                    _ => Mtu::Mtu4096,
                };
                cm.limit_mtu(d.soft.name(), mtu);
            }
            // SAFETY: `d.dev` is a device of this library (never freed).
            let ctx = unsafe { __softverbs_ibv_open_device(&d.dev as *const ibv_device as *mut ibv_device) };
            if ctx.is_null() {
                return Err(errno());
            }
            // SAFETY: the context just opened.
            let pd = unsafe { __softverbs_ibv_alloc_pd(ctx) };
            if pd.is_null() {
                return Err(errno());
            }
            Ok(Global {
                cm,
                ctx: ctx as usize,
                pd: pd as usize,
                mtu: d.mtu_cap.unwrap_or(5).min(5) as u8,
            })
        })
        .as_ref()
        .map_err(|&e| e)
}
