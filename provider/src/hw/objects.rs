//! Protection domains, memory regions, memory windows and address handles.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use rdma_sys::{ibv_ah, ibv_mr, ibv_mw, ibv_pd};

use super::convert;
use super::device::HwContext;
use super::device_life::HwDeviceLife;
use super::ffi::{self, DeallocMwFn, SendPtr};
use super::ibv_error;
use super::ibv_object::IbvObject;
use super::qp::HwQp;
use super::queue::HwSrq;
use crate::verbs::backend::*;
use crate::verbs::{verr, AccessFlags, AhAttr, MemorySource, MwType, ReregFlags, Result, Sge, SrqAttr, Verb};

/// Why fast registration is missing here (the errors say it).
const NO_FAST_REG: &str = "user-space ibverbs has no fast registration: ib_alloc_mr, ib_map_mr_sg and the \
REG_MR work request exist only in the kernel verbs API";

/// A protection domain (`struct ibv_pd`).
pub struct HwPd {
    this: Weak<HwPd>,
    pd: IbvObject<ibv_pd>,
    ctx: Arc<HwContext>,
}

impl HwPd {
    /// Wraps a fresh PD of `ctx`.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live PD of `ctx` that nothing else frees.
    pub(crate) unsafe fn new(ctx: Arc<HwContext>, ptr: SendPtr<ibv_pd>) -> Arc<HwPd> {
        Arc::new_cyclic(|this| HwPd {
            this: this.clone(),
            // SAFETY: forwarded from the caller.
            pd: unsafe { IbvObject::new(ptr, "protection domain") },
            ctx,
        })
    }

    /// The device's life.
    pub(crate) fn life(&self) -> &Arc<HwDeviceLife> {
        self.ctx.life()
    }

    fn free(&self) -> std::result::Result<(), i32> {
        let life = self.ctx.life();
        // SAFETY: the PD is freed at most once (lifecycle).
        self.pd
            .destroy(|pd| life.destroy_rc(unsafe { rdma_sys::ibv_dealloc_pd(pd) }))
    }

    /// This PD as an `Arc` (every PD lives in one).
    pub(crate) fn arc(&self) -> Arc<HwPd> {
        self.this.upgrade().expect("a live HwPd is always inside its Arc")
    }

    /// The PD's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_pd> {
        &self.pd
    }

    /// The `struct ibv_pd` pointer, for interoperating with C (rdma_cm).
    /// Valid until this PD is destroyed; do not free it.
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.raw()
    }
}

impl Drop for HwPd {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl PdOps for HwPd {
    /// `ibv_reg_mr`. The MR keeps the memory (an owned buffer is freed
    /// with its last `Arc`) until it is dropped, and lets go of it only if
    /// `ibv_dereg_mr` succeeded (after which the device no longer touches
    /// it); if deregistration never succeeds an owned buffer is leaked
    /// rather than freed under the device.
    fn reg_mr(&self, memory: MemorySource, access: AccessFlags) -> Result<Arc<dyn MrOps>> {
        let pd = self.pd.enter(Verb::RegMr)?;
        self.life().check(Verb::RegMr)?;
        let (addr, len) = (memory.addr(), memory.len());
        ffi::clear_errno();
        // SAFETY: a live PD; the range is either our own allocation (Owned,
        // kept alive by the MR) or one the caller vouched for (RawRegion).
        let raw = unsafe {
            rdma_sys::ibv_reg_mr(
                pd.ptr(),
                addr as *mut c_void,
                len,
                convert::access_to_raw(access) as i32,
            )
        };
        let ptr = SendPtr::new(raw).ok_or_else(|| ibv_error(Verb::RegMr, "ibv_reg_mr", ffi::errno_or(libc::EINVAL)))?;
        // SAFETY: a fresh MR only the HwMr frees.
        Ok(unsafe { HwMr::new(self.arc(), ptr, memory, access) })
    }

    fn alloc_fast_reg_mr(&self, _max_pages: u32) -> Result<Arc<dyn MrOps>> {
        self.life().check(Verb::AllocMr)?;
        Err(verr!(AllocMr, NotSupported, "{NO_FAST_REG}"))
    }

    /// `ibv_alloc_mw` (through the ops table, `EOPNOTSUPP` if the provider
    /// has no windows).
    fn alloc_mw(&self, mw_type: MwType) -> Result<Arc<dyn MwOps>> {
        let pd = self.pd.enter(Verb::AllocMw)?;
        self.life().check(Verb::AllocMw)?;
        ffi::clear_errno();
        // SAFETY: a live PD.
        let raw = unsafe { ffi::alloc_mw(pd.ptr(), mw_type.as_raw()) };
        let ptr = SendPtr::new(raw)
            .ok_or_else(|| ibv_error(Verb::AllocMw, "ibv_alloc_mw", ffi::errno_or(libc::EOPNOTSUPP)))?;
        // SAFETY: the window is live; its context's ops table lives as long.
        let (rkey, dealloc) = unsafe { ((*raw).rkey, ffi::ops((*raw).context).dealloc_mw) };
        Ok(Arc::new(HwMw {
            // SAFETY: a fresh window only the HwMw frees.
            mw: unsafe { IbvObject::new(ptr, "memory window") },
            rkey: AtomicU32::new(rkey),
            mw_type,
            dealloc,
            life: self.life().clone(),
            _pd: self.arc(),
        }))
    }

    fn create_qp(&self, attr: &QpCreateAttr) -> Result<Arc<dyn QpOps>> {
        self.life().check(Verb::CreateQp)?;
        HwQp::create(self, attr).map(|qp| qp as Arc<dyn QpOps>)
    }

    fn create_srq(&self, attr: SrqAttr, context: u64) -> Result<Arc<dyn SrqOps>> {
        self.life().check(Verb::CreateSrq)?;
        HwSrq::create(self, attr, context).map(|srq| srq as Arc<dyn SrqOps>)
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>> {
        let pd = self.pd.enter(Verb::CreateAh)?;
        self.life().check(Verb::CreateAh)?;
        let mut raw_attr = convert::ah_attr_to_raw(attr);
        ffi::clear_errno();
        // SAFETY: a live PD and a valid attribute struct.
        let raw = unsafe { rdma_sys::ibv_create_ah(pd.ptr(), &mut raw_attr) };
        let ptr =
            SendPtr::new(raw).ok_or_else(|| ibv_error(Verb::CreateAh, "ibv_create_ah", ffi::errno_or(libc::EINVAL)))?;
        Ok(Arc::new(HwAh {
            // SAFETY: a fresh AH only the HwAh frees.
            ah: unsafe { IbvObject::new(ptr, "address handle") },
            attr: *attr,
            life: self.life().clone(),
            _pd: self.arc(),
        }))
    }

    /// `ibv_dealloc_pd`: `EBUSY` while MRs, windows, QPs, SRQs or AHs use it.
    fn destroy(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DeallocPd, "ibv_dealloc_pd", e))
    }
}

/// What `rereg` changes together.
struct MrState {
    pd: Arc<HwPd>,
    /// The memory registered now.
    current: Option<Arc<MemorySource>>,
    /// Memory registered before a rereg. Kept, like `current`, until the MR
    /// is dropped after a successful dereg: whatever a rereg's outcome, the
    /// device never writes memory this MR let go of.
    retired: Vec<Arc<MemorySource>>,
}

/// A memory region (`struct ibv_mr`).
pub struct HwMr {
    mr: IbvObject<ibv_mr>,
    life: Arc<HwDeviceLife>,
    // Copies of the ibv_mr fields, readable without racing a rereg.
    lkey: AtomicU32,
    rkey: AtomicU32,
    addr: AtomicU64,
    length: AtomicU64,
    access: AtomicU32,
    state: Mutex<MrState>,
}

impl HwMr {
    /// # Safety
    ///
    /// `ptr` must be a live MR of `pd` over `memory` that nothing else frees.
    unsafe fn new(pd: Arc<HwPd>, ptr: SendPtr<ibv_mr>, memory: MemorySource, access: AccessFlags) -> Arc<HwMr> {
        let raw = ptr.get();
        // SAFETY: a live MR (caller); nobody else writes it yet.
        let (lkey, rkey, addr, length) = unsafe { ((*raw).lkey, (*raw).rkey, (*raw).addr as u64, (*raw).length) };
        Arc::new(HwMr {
            // SAFETY: forwarded from the caller.
            mr: unsafe { IbvObject::new(ptr, "memory region") },
            life: pd.life().clone(),
            lkey: AtomicU32::new(lkey),
            rkey: AtomicU32::new(rkey),
            addr: AtomicU64::new(addr),
            length: AtomicU64::new(length as u64),
            access: AtomicU32::new(access.bits()),
            state: Mutex::new(MrState {
                pd,
                current: Some(Arc::new(memory)),
                retired: Vec::new(),
            }),
        })
    }

    /// The MR's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_mr> {
        &self.mr
    }

    fn lock(&self) -> MutexGuard<'_, MrState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn free(&self) -> std::result::Result<(), i32> {
        // SAFETY: the MR is deregistered at most once (lifecycle). After a
        // removal, EIO means the kernel already released the registration
        // (the device no longer accesses the memory).
        self.mr
            .destroy(|mr| self.life.destroy_rc(unsafe { rdma_sys::ibv_dereg_mr(mr) }))
    }
}

impl Drop for HwMr {
    fn drop(&mut self) {
        if self.free().is_err() {
            // The device may still access the memory: never free it, even
            // when the last other reference goes.
            let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
            std::mem::forget(state.current.take());
            std::mem::forget(std::mem::take(&mut state.retired));
        }
    }
}

impl MrOps for HwMr {
    fn lkey(&self) -> u32 {
        self.lkey.load(Ordering::Acquire)
    }

    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    fn addr(&self) -> u64 {
        self.addr.load(Ordering::Acquire)
    }

    fn length(&self) -> u64 {
        self.length.load(Ordering::Acquire)
    }

    fn access(&self) -> AccessFlags {
        AccessFlags::from_bits_retain(self.access.load(Ordering::Acquire))
    }

    /// The memory registered now (owned or raw). It stays allocated while
    /// the returned `Arc` lives, and at least until the MR is deregistered.
    fn memory(&self) -> Option<Arc<MemorySource>> {
        self.lock().current.clone()
    }

    /// `ibv_rereg_mr`. `memory` must be given exactly when
    /// `CHANGE_TRANSLATION` is, and `pd` exactly when `CHANGE_PD` is
    /// (`EINVAL` otherwise). Replaced memory stays allocated until the MR
    /// is dropped.
    fn rereg(
        &self,
        flags: ReregFlags,
        pd: Option<&Arc<dyn PdOps>>,
        memory: Option<MemorySource>,
        access: AccessFlags,
    ) -> Result<()> {
        let translation = flags.contains(ReregFlags::CHANGE_TRANSLATION);
        if translation != memory.is_some() {
            return Err(verr!(
                ReregMr,
                InvalidArgument,
                "new memory is given if and only if CHANGE_TRANSLATION is set"
            ));
        }
        let new_pd = match (flags.contains(ReregFlags::CHANGE_PD), pd) {
            (false, None) => None,
            (true, Some(p)) => Some(
                super::downcast::<HwPd, _>(p)
                    .ok_or_else(|| verr!(ReregMr, InvalidArgument, "the new PD belongs to another backend"))?
                    .arc(),
            ),
            _ => {
                return Err(verr!(
                    ReregMr,
                    InvalidArgument,
                    "a PD is given if and only if CHANGE_PD is set"
                ))
            }
        };
        let mut state = self.lock();
        let mr = self.mr.enter(Verb::ReregMr)?;
        self.life.check(Verb::ReregMr)?;
        let pd_guard = new_pd.as_ref().map(|p| p.obj().enter(Verb::ReregMr)).transpose()?;
        let pd_ptr = pd_guard.as_ref().map_or(std::ptr::null_mut(), |g| g.ptr());
        let memory = memory.map(Arc::new);
        let (addr, len) = memory.as_ref().map_or((0, 0), |m| (m.addr(), m.len()));
        ffi::clear_errno();
        // SAFETY: a live MR and (if given) PD; the new range is our own
        // buffer, kept below whatever the outcome, or one the caller
        // vouched for.
        let rc = unsafe {
            rdma_sys::ibv_rereg_mr(
                mr.ptr(),
                convert::rereg_flags_to_raw(flags),
                pd_ptr,
                addr as *mut c_void,
                len,
                convert::access_to_raw(access) as i32,
            )
        };
        drop(pd_guard);
        if rc != 0 {
            // After a command error the device's view of the MR is unknown:
            // keep the new memory too.
            state.retired.extend(memory);
            // A positive errno, or a negative ibv_rereg_mr_err_code with
            // the reason in errno.
            let errno = if rc > 0 { rc } else { ffi::errno_or(libc::EINVAL) };
            return Err(ibv_error(Verb::ReregMr, "ibv_rereg_mr", errno));
        }
        if let Some(p) = new_pd {
            state.pd = p;
        }
        if let Some(m) = memory {
            let old = state.current.replace(m);
            state.retired.extend(old);
        }
        // SAFETY: a live MR; libibverbs updated its fields in the call
        // above and no other thread writes them (we hold the state lock).
        let (lkey, rkey, addr, length) = unsafe {
            (
                (*mr.ptr()).lkey,
                (*mr.ptr()).rkey,
                (*mr.ptr()).addr as u64,
                (*mr.ptr()).length,
            )
        };
        self.lkey.store(lkey, Ordering::Release);
        self.rkey.store(rkey, Ordering::Release);
        self.addr.store(addr, Ordering::Release);
        self.length.store(length as u64, Ordering::Release);
        if flags.contains(ReregFlags::CHANGE_ACCESS) {
            self.access.store(access.bits(), Ordering::Release);
        }
        Ok(())
    }

    fn map_pages(&self, _sgl: &[Sge<'_>], _page_size: u32) -> Result<usize> {
        Err(verr!(MapMrPages, NotSupported, "{NO_FAST_REG}"))
    }

    /// `ibv_dereg_mr`: `EBUSY` while windows are bound to it. The memory
    /// stays readable through [`MrOps::memory`] until the MR is dropped.
    fn dereg(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DeregMr, "ibv_dereg_mr", e))
    }
}

/// A memory window (`struct ibv_mw`).
pub struct HwMw {
    mw: IbvObject<ibv_mw>,
    rkey: AtomicU32,
    mw_type: MwType,
    dealloc: Option<DeallocMwFn>,
    life: Arc<HwDeviceLife>,
    _pd: Arc<HwPd>,
}

impl HwMw {
    /// The window's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_mw> {
        &self.mw
    }

    /// Records the rkey of a bind that was posted.
    pub(crate) fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }

    fn free(&self) -> std::result::Result<(), i32> {
        let Some(dealloc) = self.dealloc else {
            return Err(libc::EOPNOTSUPP);
        };
        // SAFETY: the window is freed at most once (lifecycle), through its
        // provider's entry point.
        self.mw.destroy(|mw| self.life.destroy_rc(unsafe { dealloc(mw) }))
    }
}

impl Drop for HwMw {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl MwOps for HwMw {
    /// The rkey of the last bind: for type 1 as `ibv_bind_mw` returned it,
    /// for type 2 the one the last successfully posted BIND_MW named.
    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    fn mw_type(&self) -> MwType {
        self.mw_type
    }

    fn dealloc(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DeallocMw, "ibv_dealloc_mw", e))
    }
}

/// An address handle (`struct ibv_ah`).
pub struct HwAh {
    ah: IbvObject<ibv_ah>,
    attr: AhAttr,
    life: Arc<HwDeviceLife>,
    _pd: Arc<HwPd>,
}

impl HwAh {
    /// The AH's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_ah> {
        &self.ah
    }

    fn free(&self) -> std::result::Result<(), i32> {
        // SAFETY: the AH is freed at most once (lifecycle).
        self.ah
            .destroy(|ah| self.life.destroy_rc(unsafe { rdma_sys::ibv_destroy_ah(ah) }))
    }
}

impl Drop for HwAh {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl AhOps for HwAh {
    fn attr(&self) -> AhAttr {
        self.attr
    }

    fn destroy(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DestroyAh, "ibv_destroy_ah", e))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::with_context;
    use super::*;
    use crate::verbs::{ErrorKind, MrMemory};

    #[test]
    fn pd_mr_lifetimes() {
        with_context("pd_mr_lifetimes", |ctx| {
            let pd = ctx.alloc_pd().expect("alloc_pd");
            let mem = MrMemory::new(8192).unwrap();
            let addr = mem.addr();
            let mr = pd
                .reg_mr(
                    MemorySource::Owned(mem),
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                )
                .expect("reg_mr");
            assert_eq!((mr.addr(), mr.length()), (addr, 8192));
            assert_ne!(mr.rkey(), 0);
            mr.memory().unwrap().write_at(0, b"abc").unwrap();
            // The PD is in use: EBUSY passes through, and it stays usable.
            assert_eq!(pd.destroy().unwrap_err().kind(), ErrorKind::Busy);
            mr.dereg().expect("dereg");
            mr.dereg().expect("dereg is idempotent");
            let mut b = [0u8; 3];
            mr.memory().unwrap().read_at(0, &mut b).unwrap();
            assert_eq!(&b, b"abc");
            pd.destroy().expect("dealloc_pd");
            pd.destroy().expect("idempotent");
            assert_eq!(
                pd.alloc_mw(MwType::Type2).err().unwrap().kind(),
                ErrorKind::InvalidArgument
            );
        });
    }

    #[test]
    fn fast_registration_is_not_supported() {
        with_context("fast_registration_is_not_supported", |ctx| {
            let pd = ctx.alloc_pd().unwrap();
            let e = pd.alloc_fast_reg_mr(16).err().unwrap();
            assert_eq!((e.kind(), e.verb()), (ErrorKind::NotSupported, Verb::AllocMr));
            assert!(e.detail().contains("user-space ibverbs"));
            // Remote write without local write: the kernel says EINVAL.
            let mem = MemorySource::Owned(MrMemory::new(4096).unwrap());
            let e = pd.reg_mr(mem, AccessFlags::REMOTE_WRITE).err().unwrap();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        });
    }
}
