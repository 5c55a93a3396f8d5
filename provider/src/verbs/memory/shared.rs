//! Shareable memory: sealed memfds mapped shared, which a soft device in
//! another process of this host can map to copy a message once (the
//! shared-memory link's trains).
//!
//! A buffer of [`SHARE_MIN`] bytes or more gets a file of its own. Smaller
//! ones are carved, page-aligned, out of *slabs*: files of [`SLAB_LEN`]
//! bytes that many buffers share, so that an application with many small
//! buffers spends one descriptor per slab, not one per buffer
//! ([`SHARE_MAX_LIVE`] files at most are alive). A peer that maps a slab
//! to read one buffer can read the other buffers in it; slabs hold only
//! memory that softverbs allocated for registration, and a peer allowed
//! cross-memory attach can read all of this process anyway.
//!
//! A buffer is freed when its last [`Arc`] goes: the [`MrMemory`](super::MrMemory)
//! and every train in flight that refers to it hold one, so a range is
//! never reused under a train. A freed slab range is zeroed (its pages are
//! given back with `FALLOC_FL_PUNCH_HOLE`, or written with zeros where that
//! fails) before it is handed out again; a slab with nothing allocated is
//! released unless it is the last one.
//!
//! After `fork`, parent and child share these mappings (they are shared
//! memory, where a heap buffer would be copied): what either writes into
//! an inherited buffer the other sees. Slabs belong to the process that
//! made them: a child carves its buffers from slabs of its own, and a
//! buffer it drops stays the parent's (not zeroed, not handed out again).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{MappedPiece, PAGE_SIZE};

/// Buffers at least this long get a shareable file of their own; smaller
/// ones share slabs ([`SLAB_LEN`]).
pub const SHARE_MIN: usize = 64 * 1024;

/// Most shareable files (each a descriptor) alive at once in a process, so
/// that an application registering thousands of large buffers does not run
/// out of descriptors for its sockets. Past it, buffers go on the heap (and
/// large messages from them packet by packet).
#[doc(hidden)] // the allocator's limit, named by the shm link's docs and tests
pub const SHARE_MAX_LIVE: usize = 256;

/// Bytes of one slab: room for at least 64 buffers just under
/// [`SHARE_MIN`]. Only what buffers touch is ever backed by memory.
#[doc(hidden)] // the allocator's slab size
pub const SLAB_LEN: usize = 4 << 20;

// Every buffer below SHARE_MIN fits in a slab.
const _: () = assert!(SHARE_MIN <= SLAB_LEN && SLAB_LEN.is_multiple_of(PAGE_SIZE));

static FILES_LIVE: AtomicUsize = AtomicUsize::new(0);

/// A sealed memfd, mapped shared in this process. What a peer maps.
#[derive(Debug)]
pub(crate) struct SharedFile {
    fd: OwnedFd,
    map: memmap2::MmapRaw,
    token: u64,
    /// The process that made the file (a forked child inherits it).
    pid: u32,
}

impl SharedFile {
    /// A new zeroed file of `len` (> 0) bytes, within [`SHARE_MAX_LIVE`].
    fn create(len: usize) -> std::io::Result<SharedFile> {
        static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
        if FILES_LIVE.fetch_add(1, Ordering::Relaxed) >= SHARE_MAX_LIVE {
            FILES_LIVE.fetch_sub(1, Ordering::Relaxed);
            return Err(std::io::Error::other("too many shareable buffers"));
        }
        let r = Self::create_file(len, NEXT_TOKEN.fetch_add(1, Ordering::Relaxed));
        if r.is_err() {
            FILES_LIVE.fetch_sub(1, Ordering::Relaxed);
        }
        r
    }

    fn create_file(len: usize, token: u64) -> std::io::Result<SharedFile> {
        let file = std::fs::File::from(crate::sys::memfd(c"softverbs-mr", libc::MFD_ALLOW_SEALING)?);
        file.set_len(len as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a live descriptor with an integer argument.
        if unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        Ok(SharedFile {
            fd: OwnedFd::from(file),
            map,
            token,
            pid: std::process::id(),
        })
    }

    /// The memfd (to pass to a peer).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A number unique to this file in this process, never reused.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Length of the file in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Gives the pages of `len` bytes at `offset` back, so that they read
    /// as zeros; writes zeros where the kernel cannot.
    fn zero(&self, offset: usize, len: usize) {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on a live descriptor; the range is inside the
        // file (callers pass a range of a buffer carved from it).
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            // SAFETY: the range is inside the mapping (as above), which is
            // writable and lives as long as `self`; nothing else uses the
            // range (its buffer is gone).
            unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(offset), 0, len) };
        }
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        FILES_LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A shareable buffer: a file of its own, or a page-aligned range of a
/// slab (see the module docs). The mapping lives as long as any `Arc` of
/// it, so a packet referring to it keeps it alive.
// Hidden: the soft provider's shared-memory trains use it; not for applications.
#[doc(hidden)]
#[derive(Debug)]
pub struct SharedMemory {
    file: Arc<SharedFile>,
    offset: usize,
    len: usize,
}

impl SharedMemory {
    /// A new zeroed shareable buffer of `len` (> 0) bytes.
    pub(super) fn create(len: usize) -> std::io::Result<SharedMemory> {
        if len >= SHARE_MIN {
            return Ok(SharedMemory {
                file: Arc::new(SharedFile::create(len)?),
                offset: 0,
                len,
            });
        }
        slabs::alloc(len.div_ceil(PAGE_SIZE) * PAGE_SIZE)
    }

    /// The memfd the buffer lies in (to pass to a peer).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd()
    }

    /// A number unique to the file the buffer lies in, in this process,
    /// never reused.
    pub fn token(&self) -> u64 {
        self.file.token()
    }

    /// Where the buffer starts in its file.
    pub fn offset(&self) -> u64 {
        self.offset as u64
    }

    /// The file the buffer lies in.
    pub(crate) fn file(&self) -> &Arc<SharedFile> {
        &self.file
    }

    /// Length in bytes (a whole number of pages for a slab buffer).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: empty buffers are not shared).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the buffer in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        // The offset is inside the mapping (set when the buffer was carved).
        self.file.map.as_mut_ptr().wrapping_add(self.offset)
    }

    /// `len` bytes at `offset` of the buffer, as a piece another device of
    /// this process may copy from; `None` if out of bounds.
    pub fn piece(&self, offset: u64, len: usize) -> Option<MappedPiece<'_>> {
        let end = offset.checked_add(len as u64)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: in bounds (checked) of the buffer, inside the mapping,
        // which lives as long as `self` is borrowed. It may overlap the
        // destination of a copy (an application writing a buffer onto
        // itself in one process): `MemorySource::write_piece` copies with
        // memmove semantics.
        Some(unsafe { MappedPiece::new(self.as_ptr().add(offset as usize), len) })
    }
}

impl AsFd for SharedMemory {
    /// The memfd the buffer lies in ([`SharedMemory::fd`]).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // A file of its own is exactly as long as its buffer; a slab is
        // longer than any buffer carved from it (SHARE_MIN <= SLAB_LEN).
        if self.len < self.file.len() {
            slabs::free(&self.file, self.offset, self.len);
        }
    }
}

/// The slabs small buffers are carved from.
mod slabs {
    use super::*;

    #[derive(Debug)]
    struct Slab {
        file: Arc<SharedFile>,
        /// Free ranges `(offset, len)`, sorted, never adjacent.
        free: Vec<(usize, usize)>,
    }

    impl Slab {
        /// First fit.
        fn take(&mut self, len: usize) -> Option<usize> {
            let i = self.free.iter().position(|&(_, n)| n >= len)?;
            let (at, n) = self.free[i];
            if n == len {
                self.free.remove(i);
            } else {
                self.free[i] = (at + len, n - len);
            }
            Some(at)
        }

        fn give(&mut self, at: usize, len: usize) {
            let i = self.free.partition_point(|&(o, _)| o < at);
            self.free.insert(i, (at, len));
            // Merge with the next range, then with the previous one.
            if i + 1 < self.free.len() && at + len == self.free[i + 1].0 {
                self.free[i].1 += self.free[i + 1].1;
                self.free.remove(i + 1);
            }
            if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == at {
                self.free[i - 1].1 += self.free[i].1;
                self.free.remove(i);
            }
        }

        fn unused(&self) -> bool {
            self.free == [(0, self.file.len())]
        }
    }

    static SLABS: Mutex<Vec<Slab>> = Mutex::new(Vec::new());

    /// A buffer of `len` bytes (a whole number of pages, below
    /// [`SLAB_LEN`]) from the first slab with room, or from a new slab.
    pub(super) fn alloc(len: usize) -> std::io::Result<SharedMemory> {
        let mut slabs = SLABS.lock().unwrap_or_else(|p| p.into_inner());
        // In a forked child, the slabs inherited are the parent's: their
        // free ranges may be the parent's buffers by now.
        let me = std::process::id();
        slabs.retain(|s| s.file.pid == me);
        let found = slabs
            .iter_mut()
            .find_map(|s| s.take(len).map(|at| (s.file.clone(), at)));
        let (file, offset) = match found {
            Some(f) => f,
            None => {
                let mut s = Slab {
                    file: Arc::new(SharedFile::create(SLAB_LEN)?),
                    free: vec![(0, SLAB_LEN)],
                };
                let at = s
                    .take(len)
                    .ok_or_else(|| std::io::Error::other("buffer larger than a slab"))?;
                let file = s.file.clone();
                slabs.push(s);
                (file, at)
            }
        };
        Ok(SharedMemory { file, offset, len })
    }

    /// Zeroes and returns a buffer's range to its slab; leaves it alone in
    /// a forked child (the range is the parent's).
    pub(super) fn free(file: &Arc<SharedFile>, offset: usize, len: usize) {
        if file.pid != std::process::id() {
            return;
        }
        file.zero(offset, len);
        let mut slabs = SLABS.lock().unwrap_or_else(|p| p.into_inner());
        let Some(i) = slabs.iter().position(|s| Arc::ptr_eq(&s.file, file)) else {
            return;
        };
        slabs[i].give(offset, len);
        if slabs[i].unused() && slabs.len() > 1 {
            slabs.swap_remove(i);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn free_ranges_merge_and_first_fit_reuses_them() {
            let file = Arc::new(SharedFile::create(16 * PAGE_SIZE).unwrap());
            let mut s = Slab {
                file,
                free: vec![(0, 16 * PAGE_SIZE)],
            };
            let p = PAGE_SIZE;
            let a = s.take(2 * p).unwrap();
            let b = s.take(3 * p).unwrap();
            let c = s.take(p).unwrap();
            assert_eq!((a, b, c), (0, 2 * p, 5 * p));
            assert_eq!(s.take(11 * p), None);
            s.give(a, 2 * p);
            s.give(c, p);
            assert_eq!(s.free, [(0, 2 * p), (5 * p, 11 * p)]);
            // The middle goes back: one range again.
            s.give(b, 3 * p);
            assert!(s.unused());
            assert_eq!(s.take(16 * p), Some(0));
        }
    }
}
