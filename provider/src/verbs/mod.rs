//! The backend-neutral verbs API.
//!
//! The same objects and calls as libibverbs (`ibv_open_device`,
//! `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_create_cq`, `ibv_create_qp`,
//! `ibv_modify_qp`, `ibv_post_send`, `ibv_poll_cq`, …) with their semantics,
//! over any backend chosen at run time: the soft provider
//! ([`crate::soft`]) or real hardware (`crate::hw`, cargo feature
//! `hardware`). Handles ([`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], …) wrap
//! backend trait objects ([`backend`]), so one program runs unchanged on
//! either.
//!
//! # Errors
//!
//! Every verb returns [`Error`]: the [`Verb`] that failed, an [`ErrorKind`]
//! that maps to the errno a hardware provider returns for the same misuse
//! (`EINVAL`, `ENOMEM`, `EBUSY`, `ENODEV`, `EOPNOTSUPP`, `EIO`), and a
//! sentence saying why. Posting returns [`PostError`], which also names the
//! first rejected work request (ibverbs' `bad_wr`).
//!
//! # Memory safety rule
//!
//! Registered memory is shared with the device and, through it, with remote
//! peers, who may write it at any moment. So:
//!
//! - **Safe code never gets a `&[u8]` or `&mut [u8]` into registered memory.**
//!   It allocates registered memory with [`Pd::alloc_mr`] and touches it only
//!   by copying ([`Mr::read`], [`Mr::write`], [`Mr::load_u64`], …).
//! - **Buffers cannot be freed or moved while a work request uses them.** A
//!   scatter/gather entry made with [`Mr::sge`] borrows the MR; the MR owns
//!   its buffer, which is freed only after deregistration, and a backend
//!   checks every key and range before touching memory, so a work request
//!   that outlives its MR fails with a protection error instead of touching
//!   freed memory.
//! - Inline data ([`Sge::inline`] with [`SendFlags::INLINE`]) is copied
//!   before `post_send` returns.
//! - The raw path for ibverbs parity, [`RawRegion`] + [`Pd::reg_mr_raw`] and
//!   [`Sge::from_raw`], is `unsafe` to construct: the caller promises what
//!   the library cannot check.
//!
//! # Examples
//!
//! ```
//! use softverbs::verbs;
//! // Soft devices exist once created: here the in-process pair.
//! softverbs::soft::embedded_default()?;
//! // Every device of every backend compiled in (hardware ones with the
//! // `hardware` feature).
//! let devs = verbs::devices(None)?;
//! assert!(devs.len() >= 2);
//! for dev in devs {
//!     let ctx = dev.open()?;
//!     let attr = ctx.query_device()?;
//!     println!("{} ({}): {} ports", dev.name(), dev.backend(), attr.phys_port_cnt);
//! }
//! # Ok::<(), softverbs::verbs::Error>(())
//! ```

pub mod attr;
pub mod backend;
pub mod connect;
pub mod error;
pub mod exchange;
pub mod handle;
pub mod memory;
pub mod qp_state;
pub mod types;
pub mod wr;
pub(crate) mod wr_check;

use std::sync::Arc;

pub use attr::*;
pub use backend::{AsyncElement, AsyncEvent, BackendKind, Provider};
pub use connect::{random_psn, Connect, Endpoint, EndpointParseError, RemoteBuffer, DEFAULT_QKEY};
pub(crate) use error::verr;
pub use error::{Error, ErrorKind, PostError, Result, Verb};
pub use handle::*;
pub use memory::{MemorySource, MrMemory, RawRegion, PAGE_SIZE, SHARE_MIN};
// The soft provider's shared-memory trains' types, for the crate only (they
// stay reachable, hidden, at `verbs::memory` for the repository's tools).
pub(crate) use memory::{MappedPiece, SharedMemory};
pub use types::*;
pub use wr::*;

/// The providers compiled into this build: the soft provider always, the
/// hardware backend with the `hardware` feature.
pub fn providers() -> Vec<Arc<dyn Provider>> {
    #[allow(unused_mut)]
    let mut v: Vec<Arc<dyn Provider>> = vec![crate::soft::provider()];
    #[cfg(feature = "hardware")]
    v.push(crate::hw::provider());
    v
}

/// The provider of one backend, if compiled in.
///
/// # Errors
///
/// `EOPNOTSUPP` for the hardware backend in a build without the `hardware`
/// feature.
pub fn provider(kind: BackendKind) -> Result<Arc<dyn Provider>> {
    providers().into_iter().find(|p| p.kind() == kind).ok_or_else(|| {
        verr!(
            GetDeviceList,
            NotSupported,
            "the {kind} backend is not compiled in (rebuild with --features hardware)"
        )
    })
}

/// The device list (`ibv_get_device_list`) of one backend, or of all
/// compiled-in backends with `None`.
///
/// # Errors
///
/// As [`provider`], or the backend's enumeration error.
pub fn devices(kind: Option<BackendKind>) -> Result<Vec<Device>> {
    let provs = match kind {
        Some(k) => vec![provider(k)?],
        None => providers(),
    };
    let mut out = Vec::new();
    for p in provs {
        match p.devices() {
            Ok(devs) => out.extend(devs.into_iter().map(Device::from_ops)),
            // With all backends requested, one that cannot enumerate (no
            // kernel support) simply contributes no devices.
            Err(e) if kind.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// Opens a device by name.
///
/// # Errors
///
/// `ENOENT` if no device has that name.
pub fn open_device(kind: Option<BackendKind>, name: &str) -> Result<Context> {
    devices(kind)?
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| verr!(OpenDevice, NotFound, "no RDMA device named '{name}'"))?
        .open()
}
