//! The hardware backend: the [`verbs`](crate::verbs) trait family over real
//! libibverbs (rdma-core) through `rdma-sys`, behind the cargo feature
//! `hardware`.
//!
//! Every trait method is one libibverbs call with its semantics and its
//! errno; errors name the [`Verb`] that failed.
//!
//! # Layout
//!
//! - `device`: the provider (`ibv_get_device_list`), devices, open contexts
//!   and their async events.
//! - `objects`: protection domains, memory regions, memory windows and
//!   address handles.
//! - `queue`: completion channels, completion queues and shared receive
//!   queues.
//! - `qp`: queue pairs (control path); `post`: building `ibv_send_wr` /
//!   `ibv_recv_wr` chains on the stack for the fast path.
//! - `convert`: every conversion between the API's types and `verbs.h`.
//! - `ffi`: the few pieces of `verbs.h` that are `static inline` (dispatch
//!   through the context's ops table) or that `rdma-sys` binds unsafely.
//! - `ibv_object`: an ibverbs object pointer and the count of calls inside
//!   it: frees each ibverbs object exactly once, never while a call is
//!   using it.
//! - `shadow`: the work requests posted and not yet completed, per queue,
//!   so that a removed device's work still completes exactly once.
//! - `device_life`: a device's life under hotplug (Live → Revoked → Inert),
//!   shared by every context and object of the device.
//! - `wake`: kernel event descriptors joined with the backend's own, for
//!   events a removal raises.
//! - `monitor`: the per-device thread reading device-wide async events.
//! - [`netns`] (shared with the soft side), [`netlink`], [`sysfs`]: network
//!   namespaces, RDMA netlink and sysfs, for discovery and the netns mode.
//!
//! # Hotplug
//!
//! The subsystem glue (`subsystem::hw`) puts hardware devices under the
//! [`Subsystem`](crate::subsystem::Subsystem): a monitor turns the
//! kernel's DEVICE_FATAL into the removal sequence, and a discovery scan
//! adds and removes devices as they come and go (or move between network
//! namespaces). Applications see the same removal behaviour as on the soft
//! provider: control verbs fail with `ENODEV`, every posted work request
//! completes exactly once (the backend synthesizes `WR_FLUSH_ERR` for what
//! the device will no longer complete), armed CQs are notified, and
//! DEVICE_FATAL is the last async event.
//!
//! # Object lifetime
//!
//! A backend object holds `Arc`s to the objects it depends on (a QP its PD,
//! CQs and SRQ; a CQ its context and channel; an MR its PD), so dependents
//! are freed first. Each object frees its ibverbs object exactly once:
//! an explicit `destroy` returns the errno of the ibverbs call (`EBUSY`
//! passes through and the object stays usable); once it succeeded, further
//! `destroy` calls succeed and do nothing, and other calls fail with
//! `EINVAL`; dropping the last `Arc` destroys the object if nobody did.
//!
//! # What user-space ibverbs cannot do
//!
//! Fast registration (`alloc_fast_reg_mr`, `map_pages`, the REG_MR work
//! request) exists only in the kernel verbs API: these return `EOPNOTSUPP`.
//!
//! # Building
//!
//! `rdma-sys` generates its bindings with bindgen at build time, which needs
//! libclang (`libclang-dev`), plus `libibverbs-dev`, `librdmacm-dev` and
//! `pkg-config`.

pub(crate) mod convert;
mod device;
pub(crate) mod device_life;
mod ffi;
mod ibv_object;
pub(crate) mod monitor;
pub mod netlink;
/// Network namespaces (moved to [`crate::netns`], which the soft side
/// uses too; re-exported here for the hardware backend's callers).
pub use crate::netns;
mod objects;
mod post;
mod qp;
mod queue;
pub(crate) mod shadow;
pub mod sysfs;
mod wake;

use std::sync::Arc;

pub(crate) use device::find_device;
pub(crate) use device::list_devices;
pub use device::{HwContext, HwDevice, HwProvider};
pub use monitor::HwEvent;
pub use objects::{HwAh, HwMr, HwMw, HwPd};
pub use qp::HwQp;
pub use queue::{HwCompChannel, HwCq, HwSrq};

use crate::verbs::{Error, ErrorKind, Provider, Verb};

/// The hardware provider: lists the RDMA devices libibverbs sees.
///
/// # Examples
///
/// ```
/// let hw = softverbs::hw::provider();
/// match hw.devices() {
///     Ok(devs) => println!("{} hardware devices", devs.len()),
///     Err(e) => println!("no RDMA support: {e}"),
/// }
/// ```
pub fn provider() -> Arc<dyn Provider> {
    Arc::new(HwProvider::new())
}

/// The concrete object behind a backend trait object, e.g. the [`HwCq`]
/// behind an `Arc<dyn CqOps>`; `None` if it belongs to another backend.
///
/// Calling `as_any()` directly on an `&Arc<dyn CqOps>` would pick the
/// blanket [`AsAny`](crate::verbs::backend::AsAny) impl of the `Arc` itself
/// and never match: this goes through the trait object.
pub(crate) fn downcast<T: 'static, O: ?Sized + crate::verbs::backend::AsAny>(obj: &Arc<O>) -> Option<&T> {
    (**obj).as_any().downcast_ref::<T>()
}

/// An error for a failed libibverbs call: `call` names the C function,
/// `errno` is what it returned or left in `errno` (either sign).
pub(crate) fn ibv_error(verb: Verb, call: &str, errno: i32) -> Error {
    let errno = errno.abs();
    let kind = ErrorKind::from_errno(errno);
    let detail = if kind.errno() == errno {
        format!("{call} failed")
    } else {
        // The kind folds several errnos together (ENXIO into ENODEV, …):
        // keep the one the device returned.
        let os = std::io::Error::from_raw_os_error(errno);
        format!("{call} failed with errno {errno} ({os})")
    };
    Error::new(verb, kind, detail)
}

/// Result of a call returning 0 or an errno (of either sign).
pub(crate) fn check(verb: Verb, call: &str, rc: i32) -> crate::verbs::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(ibv_error(verb, call, rc))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::verbs::backend::ContextOps;

    /// Runs `f` on a context of the first RDMA device, or prints a skip
    /// line (`SKIP <test>: no RDMA device`) when there is none.
    pub(crate) fn with_context(test: &str, f: impl FnOnce(&Arc<dyn ContextOps>)) {
        match provider().devices() {
            Ok(devs) if !devs.is_empty() => {
                let ctx = devs[0].open().expect("ibv_open_device");
                f(&ctx);
            }
            Ok(_) => println!("SKIP {test}: no RDMA device"),
            Err(e) => println!("SKIP {test}: no RDMA device ({e})"),
        }
    }

    #[test]
    fn downcast_goes_through_the_trait_object() {
        use crate::verbs::backend::{AsAny, CompChannelOps};
        struct Fake;
        impl CompChannelOps for Fake {
            fn get_cq_event(&self, _: Option<std::time::Duration>) -> crate::verbs::Result<Option<u64>> {
                Ok(None)
            }
            fn fd(&self) -> Option<std::os::fd::RawFd> {
                None
            }
            fn destroy(&self) -> crate::verbs::Result<()> {
                Ok(())
            }
        }
        let obj: Arc<dyn CompChannelOps> = Arc::new(Fake);
        // The trap this helper avoids:
        assert!(!obj.as_any().is::<Fake>(), "as_any on the Arc sees the Arc");
        assert!(downcast::<Fake, _>(&obj).is_some());
        assert!(downcast::<HwCompChannel, _>(&obj).is_none());
    }

    #[test]
    fn errors_keep_the_errno() {
        let e = ibv_error(Verb::DestroyCq, "ibv_destroy_cq", libc::EBUSY);
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert_eq!(e.verb(), Verb::DestroyCq);
        let e = ibv_error(Verb::OpenDevice, "ibv_open_device", -libc::ENXIO);
        assert_eq!(e.kind(), ErrorKind::NoDevice);
        assert!(e.detail().contains("errno 6"), "{}", e.detail());
        let e = ibv_error(Verb::CreateQp, "ibv_create_qp", libc::EMFILE);
        assert_eq!(e.errno(), libc::EMFILE);
        assert!(check(Verb::ModifyQp, "ibv_modify_qp", 0).is_ok());
        assert_eq!(
            check(Verb::ModifyQp, "ibv_modify_qp", 22).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
}
