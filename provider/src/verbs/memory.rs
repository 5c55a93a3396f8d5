//! Registered memory: buffers the library owns, raw ranges the caller
//! vouches for, and the only ways safe code touches either.
//!
//! Memory registered for RDMA is written by the device (or, for the soft
//! provider, by an engine thread acting for a remote peer) concurrently with
//! the program. Safe code therefore never receives a `&[u8]` or `&mut [u8]`
//! into it: it copies in and out with [`MrMemory::read`]/[`MrMemory::write`]
//! (and the same methods on [`Mr`](super::Mr)), which are bounds-checked
//! copies through raw pointers, like a DMA engine's.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::error::{verr, Result};

mod racy;
mod shared;
pub(crate) use shared::SharedFile;
pub use shared::{SharedMemory, SHARE_MAX_LIVE, SHARE_MIN, SLAB_LEN};

/// Alignment of buffers the library allocates: a page, as NICs prefer and
/// fast registration needs.
pub const PAGE_SIZE: usize = 4096;

/// A zero-initialised, page-aligned buffer owned by the library, suitable
/// for registration. It is freed only when the last backend object that
/// registered it is gone, so a device can never touch freed memory.
///
/// Buffers live in sealed memfd mappings ([`SharedMemory`]: a file of
/// their own from [`SHARE_MIN`] bytes on, a range of a shared slab below)
/// where the system allows it, so that a soft device in another process of
/// this host can map them and copy a message once (the shared-memory
/// link's trains); on the heap otherwise.
#[derive(Debug)]
pub struct MrMemory {
    ptr: NonNull<u8>,
    len: usize,
    shared: Option<Arc<SharedMemory>>,
}

/// A readable range of memory a device copies from without owning it:
/// part of another device's buffer (a train's payload), in this process or
/// mapped from another one ([`MappedPiece::new`]), or a range of another
/// process's address space that the kernel copies from
/// ([`MappedPiece::remote`], cross-memory attach). Only ever read through
/// raw-pointer or kernel copies that read the source with atomic loads,
/// so its contents may change concurrently (another process writing).
// Hidden: the soft provider's shared-memory trains use it; not for applications.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct MappedPiece<'a> {
    at: PieceAt,
    len: usize,
    _life: std::marker::PhantomData<&'a [u8]>,
}

/// Where a [`MappedPiece`] is. Private, so that safe code cannot forge a
/// local pointer.
#[derive(Debug, Clone, Copy)]
enum PieceAt {
    /// Mapped in this process, readable per [`MappedPiece::new`].
    Local(*const u8),
    /// In the address space of process `pid`, read with
    /// `process_vm_readv`.
    Remote { pid: libc::pid_t, addr: u64 },
}

// SAFETY: a MappedPiece is an address range whose validity its creator
// vouched for (MappedPiece::new), or one the kernel checks on every copy
// (MappedPiece::remote); it carries no thread affinity.
unsafe impl Send for MappedPiece<'_> {}
// SAFETY: as above; it is only read through raw-pointer or kernel copies.
unsafe impl Sync for MappedPiece<'_> {}

impl<'a> MappedPiece<'a> {
    /// A piece of `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must stay mapped and readable for `'a`. (It may
    /// overlap the destination of a copy: copies from pieces are memmoves.)
    pub unsafe fn new(ptr: *const u8, len: usize) -> MappedPiece<'a> {
        MappedPiece {
            at: PieceAt::Local(ptr),
            len,
            _life: std::marker::PhantomData,
        }
    }

    /// A piece of `len` bytes at `addr` in the address space of process
    /// `pid`, which a copy reads with `process_vm_readv` (one kernel copy
    /// straight into the destination). Safe: the kernel checks the range
    /// (an unmapped one fails the copy with `EFAULT`) and whether this
    /// process may read that one at all (ptrace access mode); nothing of
    /// this process is read. A copy from a remote piece that overlaps its
    /// destination (`pid` is this process) is not a memmove: the
    /// overlapping bytes may be garbled, never anything else.
    pub fn remote(pid: u32, addr: u64, len: usize) -> MappedPiece<'static> {
        MappedPiece {
            at: PieceAt::Remote {
                pid: pid as libc::pid_t,
                addr,
            },
            len,
            _life: std::marker::PhantomData,
        }
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the piece is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the piece is read from another process's address space.
    pub fn is_remote(&self) -> bool {
        matches!(self.at, PieceAt::Remote { .. })
    }

    /// Copies the piece into `dst` (of the piece's length).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the lengths differ; `EIO` if a remote piece could not
    /// be read in full.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len {
            return Err(verr!(
                MemoryAccess,
                InvalidArgument,
                "copy of {} bytes into {}",
                self.len,
                dst.len()
            ));
        }
        match self.at {
            // SAFETY: the source is readable per MappedPiece::new, and
            // read only with atomic loads (another process may write it
            // meanwhile: see `racy`); `dst` is valid for writes of the
            // same length, and the only reference to it is the one we
            // write through.
            PieceAt::Local(ptr) => unsafe { racy::copy(ptr, dst.as_mut_ptr(), self.len) },
            // SAFETY: `dst` is valid for writes of its length.
            PieceAt::Remote { pid, addr } => unsafe { process_read(pid, addr, dst.as_mut_ptr(), self.len) }
                .map_err(|e| verr!(MemoryAccess, Io, "cannot read {addr:#x} of process {pid}: {e}"))?,
        }
        Ok(())
    }

    /// The `len` bytes at `offset` of the piece; `None` if out of bounds.
    pub fn sub(&self, offset: usize, len: usize) -> Option<MappedPiece<'a>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Some(MappedPiece {
                at: match self.at {
                    PieceAt::Local(ptr) => PieceAt::Local(ptr.wrapping_add(offset)),
                    PieceAt::Remote { pid, addr } => PieceAt::Remote {
                        pid,
                        addr: addr.wrapping_add(offset as u64),
                    },
                },
                len,
                _life: std::marker::PhantomData,
            }),
            _ => None,
        }
    }
}

/// Copies `len` bytes at `addr` of process `pid` to `dst` with
/// `process_vm_readv`; an error unless all of them were copied.
///
/// # Safety
///
/// `dst..dst+len` must be valid for writes (the kernel writes it as a
/// device would: concurrent access by the program is a data race only on
/// the bytes, as with DMA).
unsafe fn process_read(pid: libc::pid_t, addr: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: dst.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr.wrapping_add(done as u64)) as usize as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec is valid for writes (caller); the remote
        // one is only an address in the other process, checked by the
        // kernel. One iovec each, flags 0.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            // A partial read stops at the first unreadable page.
            return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(())
}

// SAFETY: MrMemory is a heap buffer with no thread affinity; all access goes
// through raw-pointer copies whose concurrency rules are those of DMA memory
// (documented in the module docs), so sharing and sending it is sound.
unsafe impl Send for MrMemory {}
// SAFETY: see the Send impl: no method hands out references into the buffer.
unsafe impl Sync for MrMemory {}

impl MrMemory {
    /// Allocates `len` zeroed bytes aligned to [`PAGE_SIZE`].
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the allocation fails or `len` is absurdly large.
    pub fn new(len: usize) -> Result<MrMemory> {
        if len == 0 {
            return Ok(MrMemory {
                ptr: NonNull::dangling(),
                len: 0,
                shared: None,
            });
        }
        // Shareable when the system allows (memfd, sealing, mmap, and the
        // file budget); the heap otherwise: sharing is an optimisation, not
        // a contract. (Under Miri, which cannot make a memfd, the heap.)
        if let Some(Ok(shm)) = (!cfg!(miri)).then(|| SharedMemory::create(len)) {
            if let Some(ptr) = NonNull::new(shm.as_ptr()) {
                return Ok(MrMemory {
                    ptr,
                    len,
                    shared: Some(Arc::new(shm)),
                });
            }
        }
        MrMemory::heap(len)
    }

    /// Allocates `len` zeroed bytes aligned to [`PAGE_SIZE`] from the
    /// process heap, never shareable: the memory a C program registers
    /// with `ibv_reg_mr`, which a peer process on this host cannot map
    /// (the shared-memory link then copies messages through its rings, or
    /// reads large ones with cross-memory attach).
    ///
    /// # Errors
    ///
    /// As [`MrMemory::new`].
    pub fn heap(len: usize) -> Result<MrMemory> {
        if len == 0 {
            return MrMemory::new(0);
        }
        let layout = Layout::from_size_align(len, PAGE_SIZE)
            .map_err(|_| verr!(RegMr, NoMemory, "cannot allocate {len} bytes"))?;
        // SAFETY: layout has non-zero size (len > 0 checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| verr!(RegMr, NoMemory, "out of memory allocating {len} bytes"))?;
        Ok(MrMemory { ptr, len, shared: None })
    }

    /// The shareable memory behind the buffer, if it has one (where memfds
    /// work and [`SHARE_MAX_LIVE`] allows).
    #[doc(hidden)] // the soft provider's shared-memory trains use it
    pub fn shared(&self) -> Option<&Arc<SharedMemory>> {
        self.shared.as_ref()
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw start pointer (for backends).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the range is inside our allocation (checked); dst is a
        // distinct Rust buffer, so the copy does not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the buffer.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: in bounds (checked); src is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the buffer.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// Atomically loads the 8-byte word at `offset` (which must be 8-aligned
    /// and in bounds), as a peer's atomic would see it. Values are in host
    /// byte order.
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.atomic_at(offset)?.load(Ordering::Acquire))
    }

    /// Atomically stores an 8-byte word at `offset` (8-aligned, in bounds).
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.atomic_at(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    fn atomic_at(&self, offset: usize) -> Result<&AtomicU64> {
        check_range(offset, 8, self.len)?;
        let addr = self.addr() as usize + offset;
        if !addr.is_multiple_of(8) {
            return Err(verr!(
                MemoryAccess,
                InvalidArgument,
                "address {addr:#x} is not 8-byte aligned"
            ));
        }
        // SAFETY: in bounds and 8-aligned (checked); AtomicU64 has the layout
        // of u64 and tolerates concurrent access by other atomics.
        Ok(unsafe { &*(addr as *const AtomicU64) })
    }
}

impl Drop for MrMemory {
    fn drop(&mut self) {
        if self.len > 0 && self.shared.is_none() {
            let layout = Layout::from_size_align(self.len, PAGE_SIZE).expect("layout was valid at allocation");
            // SAFETY: allocated in `new` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

fn check_range(offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(verr!(
            MemoryAccess,
            InvalidArgument,
            "range {offset}+{len} is outside the {total}-byte region"
        )),
    }
}

/// Appends `len` bytes read from `ptr` to `dst`.
///
/// # Safety
///
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
pub(crate) unsafe fn append_from_ptr(ptr: *const u8, len: usize, dst: &mut Vec<u8>) {
    dst.reserve(len);
    let start = dst.len();
    // SAFETY: the caller guarantees the source range; `reserve` made room
    // for `len` more bytes after `start`, which the copy initialises before
    // the length is raised.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr, dst.as_mut_ptr().add(start), len);
        dst.set_len(start + len);
    }
}

/// A range of caller-owned memory to register with
/// [`Pd::reg_mr_raw`](super::Pd::reg_mr_raw).
#[derive(Debug, Clone, Copy)]
pub struct RawRegion {
    addr: *mut u8,
    len: usize,
}

// SAFETY: a RawRegion is an address range the caller vouched for in
// `RawRegion::new`; it carries no thread affinity.
unsafe impl Send for RawRegion {}
// SAFETY: as above; it is only an address and a length.
unsafe impl Sync for RawRegion {}

impl RawRegion {
    /// A region of `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// The range must be valid for reads and writes for as long as any
    /// registration of it exists (until dereg returns), and the program must
    /// not hold Rust references into it while the device may access it.
    pub unsafe fn new(addr: *mut u8, len: usize) -> RawRegion {
        RawRegion { addr, len }
    }

    /// Start address.
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What an MR registers: a library-owned buffer or a raw caller range.
#[derive(Debug)]
pub enum MemorySource {
    /// A buffer the backend object takes ownership of.
    Owned(MrMemory),
    /// A range whose validity the caller guarantees.
    Raw(RawRegion),
}

impl MemorySource {
    /// Start address.
    pub fn addr(&self) -> u64 {
        match self {
            MemorySource::Owned(m) => m.addr(),
            MemorySource::Raw(r) => r.addr as u64,
        }
    }

    /// Length.
    pub fn len(&self) -> usize {
        match self {
            MemorySource::Owned(m) => m.len(),
            MemorySource::Raw(r) => r.len,
        }
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shareable memory the range lives in (offsets in the range are
    /// offsets in it), if any.
    #[doc(hidden)] // the soft provider's shared-memory trains use it
    pub fn shared(&self) -> Option<&Arc<SharedMemory>> {
        match self {
            MemorySource::Owned(m) => m.shared(),
            MemorySource::Raw(_) => None,
        }
    }

    /// Copies `src` to `offset` (a device writing memory from a buffer it
    /// does not own, such as a train's payload).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the memory; for a remote piece
    /// ([`MappedPiece::remote`]), `EIO` if the source could not be read
    /// in full (unmapped there, the process gone, no permission): the
    /// destination may then hold part of the piece.
    #[doc(hidden)] // the soft provider's shared-memory trains use it
    pub fn write_piece(&self, offset: usize, src: MappedPiece<'_>) -> Result<()> {
        check_range(offset, src.len, self.len())?;
        match src.at {
            // SAFETY: destination in bounds (checked), valid as in read_at;
            // the source is readable per MappedPiece::new and read only
            // with atomic loads (its owner may write it meanwhile: see
            // `racy`); `racy::copy` allows overlap.
            PieceAt::Local(ptr) => unsafe { racy::copy(ptr, self.ptr().add(offset), src.len) },
            PieceAt::Remote { pid, addr } => {
                // SAFETY: destination in bounds (checked) and valid for
                // writes as in write_at; the kernel checks the source.
                unsafe { process_read(pid, addr, self.ptr().add(offset), src.len) }.map_err(|e| {
                    verr!(
                        MemoryAccess,
                        Io,
                        "cannot read {} bytes at {addr:#x} of process {pid}: {e}",
                        src.len
                    )
                })?;
            }
        }
        Ok(())
    }

    fn ptr(&self) -> *mut u8 {
        match self {
            MemorySource::Owned(m) => m.as_ptr(),
            MemorySource::Raw(r) => r.addr,
        }
    }

    /// Copies bytes at `offset` into `dst` (a device reading memory).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the memory.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        // SAFETY: in bounds (checked); Owned memory is our allocation, Raw
        // memory is valid per RawRegion::new's contract while registered;
        // dst is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`MemorySource::write_at`] for a device's per-message path: `false`
    /// (nothing written) if the range is outside the memory, and no error
    /// built (`write_at`'s `Result` and its call were ~35 instructions of
    /// an 8-byte receive).
    #[inline]
    pub fn try_write(&self, offset: usize, src: &[u8]) -> bool {
        if offset.checked_add(src.len()).is_none_or(|end| end > self.len()) {
            return false;
        }
        // SAFETY: in bounds (checked); valid as in read_at; src is a
        // distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr().add(offset), src.len()) };
        true
    }

    /// [`MemorySource::append_to`] for a device's per-message path: `false`
    /// (nothing appended) if the range is outside the memory.
    #[inline]
    pub fn try_append(&self, offset: usize, len: usize, dst: &mut Vec<u8>) -> bool {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return false;
        }
        // SAFETY: in bounds (checked); valid as in read_at.
        unsafe { append_from_ptr(self.ptr().add(offset), len, dst) };
        true
    }

    /// Copies `src` to `offset` (a device writing memory).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the memory.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        if self.try_write(offset, src) {
            Ok(())
        } else {
            check_range(offset, src.len(), self.len())
        }
    }

    /// Appends `len` bytes at `offset` to `dst` (one copy, no zeroing of
    /// `dst` first).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the memory.
    pub fn append_to(&self, offset: usize, len: usize, dst: &mut Vec<u8>) -> Result<()> {
        if self.try_append(offset, len, dst) {
            Ok(())
        } else {
            check_range(offset, len, self.len())
        }
    }

    fn atomic_at(&self, offset: usize) -> Result<&AtomicU64> {
        check_range(offset, 8, self.len())?;
        // SAFETY: in bounds (checked); the pointer is valid as in read_at.
        let addr = unsafe { self.ptr().add(offset) } as usize;
        if !addr.is_multiple_of(8) {
            return Err(verr!(
                MemoryAccess,
                InvalidArgument,
                "address {addr:#x} is not 8-byte aligned"
            ));
        }
        // SAFETY: in bounds, 8-aligned, valid for the registration's life;
        // AtomicU64 has u64's layout.
        Ok(unsafe { &*(addr as *const AtomicU64) })
    }

    /// Atomic compare-and-swap of the aligned 8-byte word at `offset`
    /// (host byte order); returns the original value.
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64> {
        let a = self.atomic_at(offset)?;
        Ok(
            match a.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomically loads the aligned 8-byte word at `offset` (host order).
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.atomic_at(offset)?.load(Ordering::Acquire))
    }

    /// Atomically stores the aligned 8-byte word at `offset` (host order).
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.atomic_at(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the memory.
    pub fn fill_at(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        check_range(offset, len, self.len())?;
        // SAFETY: in bounds (checked); valid as in read_at.
        unsafe { std::ptr::write_bytes(self.ptr().add(offset), byte, len) };
        Ok(())
    }

    /// Atomic fetch-and-add of the aligned 8-byte word at `offset` (host
    /// byte order, wrapping); returns the original value.
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned or out of bounds.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64> {
        Ok(self.atomic_at(offset)?.fetch_add(add, Ordering::AcqRel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_memory_is_zeroed_aligned_and_bounds_checked() {
        let m = MrMemory::new(10_000).unwrap();
        assert_eq!(m.addr() % PAGE_SIZE as u64, 0);
        let mut buf = [0xffu8; 16];
        m.read(9_984, &mut buf).unwrap();
        assert_eq!(buf, [0; 16]);
        m.write(5, b"hello").unwrap();
        m.read(5, &mut buf[..5]).unwrap();
        assert_eq!(&buf[..5], b"hello");
        assert!(m.read(9_990, &mut buf).is_err());
        assert!(m.write(usize::MAX, b"x").is_err());
        m.store_u64(16, 42).unwrap();
        assert_eq!(m.load_u64(16).unwrap(), 42);
        assert!(m.load_u64(17).is_err());
        assert!(m.load_u64(9_996).is_err());
    }

    #[test]
    fn buffers_are_sealed_shareable_memfds() {
        let m = MrMemory::new(SHARE_MIN).unwrap();
        let shm = m.shared().expect("memfds work here").clone();
        assert_eq!((shm.as_ptr() as u64, shm.len(), shm.offset()), (m.addr(), SHARE_MIN, 0));
        // SAFETY: fcntl on a live descriptor, no argument.
        let seals = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&shm.fd()), libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & want, want, "a peer mapping it can never see it shrink");
        m.write(100, b"abc").unwrap();
        let src = MemorySource::Owned(MrMemory::new(16).unwrap());
        src.write_piece(0, shm.piece(100, 3).unwrap()).unwrap();
        let mut got = [0u8; 3];
        src.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"abc");
        assert!(shm.piece(SHARE_MIN as u64 - 2, 3).is_none());
        assert!(shm.piece(u64::MAX, 1).is_none());
        assert!(shm.piece(0, 3).unwrap().sub(2, 2).is_none());
        assert!(src.write_piece(15, shm.piece(0, 2).unwrap()).is_err());
        // The mapping outlives the buffer while a packet holds it.
        drop(m);
        assert!(shm.piece(100, 3).is_some());
    }

    /// Small buffers are page-aligned ranges of shared slabs: many of them
    /// take few files, and each starts zeroed even where it reuses the
    /// range of a freed one.
    #[test]
    fn small_buffers_share_slabs_and_start_zeroed() {
        let small = MrMemory::new(100).unwrap();
        let shm = small.shared().expect("memfds work here");
        assert_eq!((shm.len(), shm.offset() % PAGE_SIZE as u64), (PAGE_SIZE, 0));
        assert_eq!(shm.file().len(), SLAB_LEN);
        assert_eq!(shm.as_ptr() as u64, small.addr());
        for round in 0..2 {
            let bufs: Vec<MrMemory> = (0..100).map(|_| MrMemory::new(8 << 10).unwrap()).collect();
            let mut files: Vec<u64> = bufs.iter().map(|b| b.shared().unwrap().token()).collect();
            files.sort_unstable();
            files.dedup();
            // 800 KiB in 4 MiB slabs (other tests allocate meanwhile).
            assert!(files.len() <= 4, "{} files for 100 small buffers", files.len());
            for b in &bufs {
                let mut v = vec![0xffu8; 8 << 10];
                b.read(0, &mut v).unwrap();
                assert!(
                    v.iter().all(|&x| x == 0),
                    "round {round}: a reused range was not zeroed"
                );
                b.write(0, &[0xa5; 8 << 10]).unwrap();
            }
        }
    }

    #[test]
    fn remote_pieces_are_read_with_process_vm_readv() {
        let src: Vec<u8> = (0..100_000u32).map(|k| (k % 241) as u8).collect();
        let me = std::process::id();
        let piece = MappedPiece::remote(me, src.as_ptr() as u64, src.len());
        assert!(piece.is_remote() && piece.len() == src.len());
        let dst = MemorySource::Owned(MrMemory::new(200_000).unwrap());
        dst.write_piece(5, piece).unwrap();
        dst.write_piece(150_000, piece.sub(1000, 10).unwrap()).unwrap();
        let mut got = vec![0u8; src.len()];
        dst.read_at(5, &mut got).unwrap();
        assert_eq!(got, src);
        let mut got = [0u8; 10];
        piece.sub(1000, 10).unwrap().copy_to(&mut got).unwrap();
        assert_eq!(&got[..], &src[1000..1010]);
        dst.read_at(150_000, &mut got).unwrap();
        assert_eq!(&got[..], &src[1000..1010]);
        assert!(piece.sub(99_999, 2).is_none());
        // Bounds of the destination are checked before any read.
        assert!(dst.write_piece(150_000, piece).is_err());
        // An unmapped source fails (page 1 is never mapped; the top of the
        // address space is not user memory).
        assert!(dst.write_piece(0, MappedPiece::remote(me, 4096, 64)).is_err());
        assert!(dst
            .write_piece(0, MappedPiece::remote(me, (1u64 << 47) - 16, 64))
            .is_err());
        // No such process.
        assert!(dst
            .write_piece(0, MappedPiece::remote(u32::MAX >> 1, src.as_ptr() as u64, 8))
            .is_err());
        let mut small = [0u8; 3];
        assert!(piece.copy_to(&mut small).is_err());
    }
}
