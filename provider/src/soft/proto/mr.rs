//! The key table: memory regions, fast-registration MRs and memory windows
//! share one space of 24-bit indexes with an 8-bit key byte (docs/design.md §3.1,
//! §3.6). Every device-side memory access resolves a key here, with PD,
//! access and bounds checks.

use std::sync::Arc;

use crate::verbs::{AccessFlags, MemorySource, MwType};

use super::by_reference::{TrainCaps, TrainIn, TrainPiece};
use super::qp::SgeRaw;
use super::{PdId, SplitMix};

/// Why a key check failed; the caller turns it into the status of its side
/// (local: LOC_PROT_ERR; remote: a remote-access NAK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No valid object has this key (unused index, stale key byte, FREE
    /// fast-registration MR, unbound window, or a window used as an lkey).
    BadKey,
    /// The object belongs to another protection domain (or, for a type 2
    /// window, is bound to another QP).
    WrongPd,
    /// A required right is missing.
    Access,
    /// The range is outside the region or window.
    Bounds,
}

/// A contiguous piece of registered memory.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) memory: Arc<MemorySource>,
    pub(crate) offset: usize,
    pub(crate) len: u64,
}

/// The translation of a VALID fast-registration MR.
#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    pub(crate) segments: Vec<Segment>,
}

/// A memory window binding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binding {
    /// Key of the MR the window is bound onto.
    pub(crate) mr_key: u32,
    /// QP a type 2 window is bound to (IBTA type 2B).
    pub(crate) qpn: Option<u32>,
}

#[derive(Debug)]
pub(crate) enum Backing {
    /// `ibv_reg_mr`: a memory range.
    Plain(Arc<MemorySource>),
    /// A fast-registration MR: FREE (`valid == false`) or VALID with the
    /// current mapping.
    FastReg {
        max_pages: u32,
        valid: bool,
        mapping: Option<Mapping>,
    },
    /// A memory window, bound or not.
    Window { mw_type: MwType, binding: Option<Binding> },
}

/// One entry of the key table.
#[derive(Debug)]
pub(crate) struct MrEntry {
    /// Current full key (index << 8 | key byte).
    pub(crate) key: u32,
    pub(crate) pd: PdId,
    pub(crate) access: AccessFlags,
    /// First address (iova) of the region or window.
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) backing: Backing,
    /// Windows bound onto this MR (dereg is EBUSY while non-zero).
    pub(crate) windows: u32,
}

impl MrEntry {
    pub(crate) fn is_window(&self) -> bool {
        matches!(self.backing, Backing::Window { .. })
    }
}

/// A checked range: one or more pieces of memory to copy through.
///
/// A plain MR's range borrows the MR's memory from the table: the checks
/// run on every message, and cloning the `Arc` (a locked increment and
/// decrement, which also drain the store buffer) bought nothing while the
/// table cannot change under the borrow.
#[derive(Debug, Clone)]
pub(crate) enum Resolved<'a> {
    One {
        memory: &'a Arc<MemorySource>,
        offset: usize,
    },
    Many(Vec<Segment>),
}

impl Resolved<'_> {
    /// Copies `src` into the range.
    pub(crate) fn write(&self, src: &[u8]) -> Result<(), ()> {
        match self {
            Resolved::One { memory, offset } => memory.write_at(*offset, src).map_err(|_| ()),
            Resolved::Many(segs) => {
                let mut done = 0;
                for s in segs {
                    let n = (s.len as usize).min(src.len() - done);
                    s.memory.write_at(s.offset, &src[done..done + n]).map_err(|_| ())?;
                    done += n;
                }
                if done == src.len() {
                    Ok(())
                } else {
                    Err(())
                }
            }
        }
    }

    /// Appends the range's bytes to `dst` (`len` is the range's length).
    pub(crate) fn append_to(&self, len: usize, dst: &mut Vec<u8>) -> Result<(), ()> {
        match self {
            Resolved::One { memory, offset } => memory.append_to(*offset, len, dst).map_err(|_| ()),
            Resolved::Many(segs) => {
                let mut left = len;
                for s in segs {
                    let n = (s.len as usize).min(left);
                    s.memory.append_to(s.offset, n, dst).map_err(|_| ())?;
                    left -= n;
                }
                if left == 0 {
                    Ok(())
                } else {
                    Err(())
                }
            }
        }
    }

    /// Appends the range (`len` bytes) as train pieces to `out`: a
    /// [`TrainPiece::Shared`] piece where the memory is shareable and
    /// `caps` allows those, else a [`TrainPiece::Process`] range where
    /// `caps` allows that; fails if some of it can be neither.
    pub(crate) fn train_pieces(&self, len: usize, caps: TrainCaps, out: &mut Vec<TrainPiece>) -> Result<(), ()> {
        let mut push = |m: &MemorySource, offset: usize, n: usize| -> Result<(), ()> {
            let len = u32::try_from(n).map_err(|_| ())?;
            match m.shared() {
                Some(mem) if caps.shared => out.push(TrainPiece::Shared {
                    mem: mem.clone(),
                    offset: offset as u64,
                    len,
                }),
                _ if caps.process => out.push(TrainPiece::Process {
                    addr: m.addr().checked_add(offset as u64).ok_or(())?,
                    len,
                }),
                _ => return Err(()),
            }
            Ok(())
        };
        match self {
            Resolved::One { memory, offset } => push(memory, *offset, len),
            Resolved::Many(segs) => {
                let mut left = len;
                for s in segs {
                    let n = (s.len as usize).min(left);
                    if n > 0 {
                        push(&s.memory, s.offset, n)?;
                    }
                    left -= n;
                }
                if left == 0 {
                    Ok(())
                } else {
                    Err(())
                }
            }
        }
    }

    /// Copies `len` bytes of a train's payload, from `src_off` on, into
    /// the range (whose length is `len`). The last bytes are written
    /// last, after a release fence, as with the last packet of a message:
    /// an application polling the last byte sees the rest.
    pub(crate) fn write_train(&self, t: &TrainIn<'_>, src_off: u64, len: usize) -> Result<(), ()> {
        const TAIL: usize = 64;
        // The common case, one range of memory and the bytes in one piece
        // of the train (every train the shm link builds from one buffer):
        // each span is one copy, without the walk of `write_train_span`.
        let direct = match self {
            Resolved::One { memory, offset } => t.contiguous(src_off, len).map(|p| (memory, *offset, p)),
            Resolved::Many(_) => None,
        };
        let span = |at: usize, n: usize| match &direct {
            Some((memory, offset, p)) => memory.write_piece(offset + at, p.sub(at, n).ok_or(())?).map_err(|_| ()),
            None => self.write_train_span(t, src_off + at as u64, at, n),
        };
        if len > TAIL {
            span(0, len - TAIL)?;
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            span(len - TAIL, TAIL)
        } else {
            span(0, len)
        }
    }

    /// Copies `len` train bytes from `src_off` to the range's offset `at`.
    // Out of line: inlined into `write_train`, the walk made the common
    // one-copy case ~1-2 % slower in shm write_bw at 64 KiB.
    #[inline(never)]
    fn write_train_span(&self, t: &TrainIn<'_>, src_off: u64, at: usize, len: usize) -> Result<(), ()> {
        // (memory, offset, length) per segment; a single range borrows its
        // memory rather than cloning the Arc.
        let one;
        let segs: &mut dyn Iterator<Item = (&MemorySource, usize, u64)> = match self {
            Resolved::One { memory, offset } => {
                one = [(&***memory, *offset, u64::MAX)];
                &mut one.iter().copied()
            }
            Resolved::Many(segs) => &mut segs.iter().map(|s| (&*s.memory, s.offset, s.len)),
        };
        let (mut skip, mut src, mut left) = (at as u64, src_off, len as u64);
        for (memory, offset, seg_len) in segs {
            if left == 0 {
                break;
            }
            if skip >= seg_len {
                skip -= seg_len;
                continue;
            }
            let n = (seg_len - skip).min(left);
            let mut dst = offset + skip as usize;
            t.for_each_range(src, n, |p| {
                memory.write_piece(dst, p).map_err(|_| ())?;
                dst += p.len();
                Ok(())
            })?;
            src += n;
            left -= n;
            skip = 0;
        }
        if left == 0 {
            Ok(())
        } else {
            Err(())
        }
    }

    fn single(&self) -> Option<(&MemorySource, usize)> {
        match self {
            Resolved::One { memory, offset } => Some((memory, *offset)),
            Resolved::Many(segs) if segs.len() == 1 => Some((&segs[0].memory, segs[0].offset)),
            Resolved::Many(_) => None,
        }
    }

    /// Atomic compare-and-swap of the 8-byte word (host order).
    pub(crate) fn compare_swap_u64(&self, compare: u64, swap: u64) -> Result<u64, ()> {
        let (m, o) = self.single().ok_or(())?;
        m.compare_swap_u64(o, compare, swap).map_err(|_| ())
    }

    /// Atomic fetch-and-add of the 8-byte word (host order).
    pub(crate) fn fetch_add_u64(&self, add: u64) -> Result<u64, ()> {
        let (m, o) = self.single().ok_or(())?;
        m.fetch_add_u64(o, add).map_err(|_| ())
    }
}

#[derive(Debug, Default)]
pub(crate) struct MrTable {
    entries: Vec<Option<MrEntry>>,
    free: std::collections::VecDeque<u32>,
    live: u32,
}

/// Largest index (24 bits; index 0 is never used so that key 0 is invalid).
const MAX_INDEX: u32 = (1 << 24) - 1;

impl MrTable {
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Inserts an entry with a fresh key byte; returns the key.
    pub(crate) fn insert(
        &mut self,
        rng: &mut SplitMix,
        pd: PdId,
        access: AccessFlags,
        iova: u64,
        len: u64,
        backing: Backing,
    ) -> Option<u32> {
        // Reuse indexes oldest-freed first, so a stale key is unlikely to
        // meet a new object at the same index soon.
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.entries.len() + 1).ok()?;
                if i > MAX_INDEX {
                    return None;
                }
                self.entries.push(None);
                i
            }
        };
        let key = (index << 8) | u32::from(rng.next_u8());
        self.entries[(index - 1) as usize] = Some(MrEntry {
            key,
            pd,
            access,
            iova,
            len,
            backing,
            windows: 0,
        });
        self.live += 1;
        Some(key)
    }

    fn slot(&self, key: u32) -> Option<&MrEntry> {
        let index = key >> 8;
        self.entries.get(index.checked_sub(1)? as usize)?.as_ref()
    }

    fn slot_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        let index = key >> 8;
        self.entries.get_mut(index.checked_sub(1)? as usize)?.as_mut()
    }

    /// The entry whose current key is exactly `key`.
    pub(crate) fn get(&self, key: u32) -> Option<&MrEntry> {
        self.slot(key).filter(|e| e.key == key)
    }

    /// As [`MrTable::get`], mutable.
    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        self.slot_mut(key).filter(|e| e.key == key)
    }

    /// The entry at `key`'s index whatever its key byte (fast registration
    /// and window binds change the key byte of an object the caller names by
    /// its previous key).
    pub(crate) fn get_by_index_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        self.slot_mut(key)
    }

    /// Removes the entry with this key; the index becomes reusable.
    pub(crate) fn remove(&mut self, key: u32) -> Option<MrEntry> {
        let index = key >> 8;
        let slot = self.entries.get_mut(index.checked_sub(1)? as usize)?;
        if slot.as_ref().is_some_and(|e| e.key == key) {
            self.live -= 1;
            self.free.push_back(index);
            slot.take()
        } else {
            None
        }
    }

    /// Checks `len` bytes at `addr` under local key `key` for `pd` with
    /// rights `need`. A zero-length range needs no valid key (IBTA 9.4.4:
    /// zero-length RDMA needs no key check) and resolves to `None`.
    pub(crate) fn check(
        &self,
        key: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<Resolved<'_>>, KeyError> {
        if len == 0 {
            return Ok(None);
        }
        let e = self.get(key).ok_or(KeyError::BadKey)?;
        if e.is_window() {
            return Err(KeyError::BadKey);
        }
        if e.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !e.access.contains(need) {
            return Err(KeyError::Access);
        }
        Self::resolve(e, addr, len).map(Some)
    }

    /// [`MrTable::check`] of `len` bytes at `addr` (`len > 0`), then the
    /// write of `data` (no longer) at `addr`, in one step for a plain MR:
    /// no [`Resolved`] built and dropped (~40 instructions of every receive
    /// a ping-pong places). `None`: nothing was written, because the key
    /// is not a plain MR's or a check failed; [`MrTable::check`] tells
    /// which.
    #[inline]
    pub(crate) fn write_plain(
        &self,
        key: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        need: AccessFlags,
        data: &[u8],
    ) -> Option<()> {
        let e = self.get(key)?;
        if e.pd != pd || !e.access.contains(need) {
            return None;
        }
        let (memory, offset) = Self::plain_at(e, addr, len)?;
        memory.try_write(offset, data).then_some(())
    }

    /// [`MrTable::resolve`] of `len` bytes at `addr` under `key` and the
    /// read of them onto `dst`, in one step for a plain MR (an inline
    /// send's bytes: no access check, as with ibverbs' INLINE). `None`:
    /// nothing was appended; the key is not a plain MR's or the range is
    /// outside it.
    #[inline]
    pub(crate) fn read_plain(&self, key: u32, addr: u64, len: u64, dst: &mut Vec<u8>) -> Option<()> {
        let (memory, offset) = Self::plain_at(self.get(key)?, addr, len)?;
        memory.try_append(offset, usize::try_from(len).ok()?, dst).then_some(())
    }

    /// The memory and offset behind `len` bytes at `addr` of `e`, a plain
    /// MR's entry; `None` for another registration or a range that is not
    /// wholly in the MR (the checks of [`MrTable::resolve`]).
    #[inline]
    fn plain_at(e: &MrEntry, addr: u64, len: u64) -> Option<(&Arc<MemorySource>, usize)> {
        let Backing::Plain(memory) = &e.backing else {
            return None;
        };
        let end = addr.checked_add(len)?;
        if addr < e.iova || end > e.iova.saturating_add(e.len) {
            return None;
        }
        Some((memory, usize::try_from(addr - e.iova).ok()?))
    }

    /// Checks a remote access under `rkey` by `qpn` (of PD `pd`): MRs,
    /// fast-registration MRs and memory windows.
    pub(crate) fn check_remote(
        &self,
        rkey: u32,
        pd: PdId,
        qpn: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<Resolved<'_>>, KeyError> {
        if len == 0 {
            return Ok(None);
        }
        let e = self.get(rkey).ok_or(KeyError::BadKey)?;
        if e.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !e.access.contains(need) {
            return Err(KeyError::Access);
        }
        match &e.backing {
            Backing::Window { binding, .. } => {
                let b = binding.ok_or(KeyError::BadKey)?;
                if b.qpn.is_some_and(|q| q != qpn) {
                    return Err(KeyError::WrongPd);
                }
                let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
                if addr < e.iova || end > e.iova + e.len {
                    return Err(KeyError::Bounds);
                }
                let mr = self.get(b.mr_key).ok_or(KeyError::BadKey)?;
                Self::resolve(mr, addr, len).map(Some)
            }
            _ => Self::resolve(e, addr, len).map(Some),
        }
    }

    pub(crate) fn resolve(e: &MrEntry, addr: u64, len: u64) -> Result<Resolved<'_>, KeyError> {
        let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
        if addr < e.iova || end > e.iova.saturating_add(e.len) {
            return Err(KeyError::Bounds);
        }
        let off = addr - e.iova;
        match &e.backing {
            Backing::Plain(memory) => Ok(Resolved::One {
                memory,
                offset: usize::try_from(off).map_err(|_| KeyError::Bounds)?,
            }),
            Backing::FastReg { valid: false, .. } | Backing::FastReg { mapping: None, .. } => Err(KeyError::BadKey),
            Backing::FastReg { mapping: Some(m), .. } => {
                let mut out = Vec::new();
                let mut skip = off;
                let mut want = len;
                for s in &m.segments {
                    if want == 0 {
                        break;
                    }
                    if skip >= s.len {
                        skip -= s.len;
                        continue;
                    }
                    let n = (s.len - skip).min(want);
                    out.push(Segment {
                        memory: s.memory.clone(),
                        offset: s.offset + skip as usize,
                        len: n,
                    });
                    want -= n;
                    skip = 0;
                }
                if want != 0 {
                    return Err(KeyError::Bounds);
                }
                Ok(Resolved::Many(out))
            }
            Backing::Window { .. } => Err(KeyError::BadKey),
        }
    }

    /// Walks bytes `offset..offset + len` of a message laid out over the
    /// scatter list `sgl`, checks each piece under its lkey for `pd` with
    /// rights `need`, and calls `f(piece, at, n)` for the `n` bytes that
    /// start at `at` within those `len` bytes. Fails if a check fails or the
    /// list is shorter than the range. (Gather for requests, scatter for
    /// read responses, atomic results and receives.)
    pub(crate) fn for_each_piece(
        &self,
        sgl: &[SgeRaw],
        pd: PdId,
        mut offset: u64,
        len: usize,
        need: AccessFlags,
        mut f: impl FnMut(&Resolved<'_>, usize, usize) -> Result<(), ()>,
    ) -> Result<(), ()> {
        let mut done = 0usize;
        for s in sgl {
            if done == len {
                break;
            }
            let sl = u64::from(s.len);
            if offset >= sl {
                offset -= sl;
                continue;
            }
            let n = ((sl - offset) as usize).min(len - done);
            if let Some(r) = self
                .check(s.lkey, pd, s.addr + offset, n as u64, need)
                .map_err(|_| ())?
            {
                f(&r, done, n)?;
            }
            done += n;
            offset = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Whether any entry belongs to `pd`.
    pub(crate) fn uses_pd(&self, pd: PdId) -> bool {
        self.entries.iter().flatten().any(|e| e.pd == pd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::MrMemory;

    fn table_with_one(access: AccessFlags) -> (MrTable, u32, u64) {
        let mut t = MrTable::default();
        let mut rng = SplitMix::new(1);
        let mem = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
        let addr = mem.addr();
        let key = t
            .insert(&mut rng, PdId(1), access, addr, 4096, Backing::Plain(mem))
            .unwrap();
        (t, key, addr)
    }

    #[test]
    fn key_checks_cover_key_pd_access_and_bounds() {
        let (t, key, addr) = table_with_one(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        assert!(t
            .check(key, PdId(1), addr, 4096, AccessFlags::REMOTE_READ)
            .unwrap()
            .is_some());
        assert_eq!(
            t.check(key ^ 1, PdId(1), addr, 1, AccessFlags::empty()).unwrap_err(),
            KeyError::BadKey
        );
        assert_eq!(
            t.check(key, PdId(2), addr, 1, AccessFlags::empty()).unwrap_err(),
            KeyError::WrongPd
        );
        assert_eq!(
            t.check(key, PdId(1), addr, 1, AccessFlags::REMOTE_WRITE).unwrap_err(),
            KeyError::Access
        );
        assert_eq!(
            t.check(key, PdId(1), addr + 1, 4096, AccessFlags::empty()).unwrap_err(),
            KeyError::Bounds
        );
        assert_eq!(
            t.check(key, PdId(1), u64::MAX, 2, AccessFlags::empty()).unwrap_err(),
            KeyError::Bounds
        );
        assert!(t.check(0, PdId(9), 0, 0, AccessFlags::REMOTE_WRITE).unwrap().is_none());
    }

    #[test]
    fn removed_key_is_dead() {
        let (mut t, key, addr) = table_with_one(AccessFlags::LOCAL_WRITE);
        assert!(t.remove(key).is_some());
        assert!(t.remove(key).is_none());
        assert_eq!(
            t.check(key, PdId(1), addr, 1, AccessFlags::empty()).unwrap_err(),
            KeyError::BadKey
        );
        assert_eq!(t.live(), 0);
    }

    #[test]
    fn fast_reg_mapping_spans_segments_and_free_is_a_bad_key() {
        let mut t = MrTable::default();
        let mut rng = SplitMix::new(2);
        let m1 = Arc::new(MemorySource::Owned(MrMemory::new(8192).unwrap()));
        let m2 = Arc::new(MemorySource::Owned(MrMemory::new(8192).unwrap()));
        let key = t
            .insert(
                &mut rng,
                PdId(1),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                0x10000,
                8192,
                Backing::FastReg {
                    max_pages: 2,
                    valid: true,
                    mapping: Some(Mapping {
                        segments: vec![
                            Segment {
                                memory: m1.clone(),
                                offset: 4096,
                                len: 4096,
                            },
                            Segment {
                                memory: m2.clone(),
                                offset: 0,
                                len: 4096,
                            },
                        ],
                    }),
                },
            )
            .unwrap();
        let r = t
            .check_remote(key, PdId(1), 5, 0x10000 + 4090, 12, AccessFlags::REMOTE_READ)
            .unwrap()
            .unwrap();
        r.write(&[7u8; 12]).unwrap();
        let mut b = [0u8; 6];
        m1.read_at(8186, &mut b).unwrap();
        assert_eq!(b, [7; 6]);
        m2.read_at(0, &mut b).unwrap();
        assert_eq!(b, [7; 6]);
        if let Some(e) = t.get_mut(key) {
            e.backing = Backing::FastReg {
                max_pages: 2,
                valid: false,
                mapping: None,
            };
        }
        assert_eq!(
            t.check_remote(key, PdId(1), 5, 0x10000, 1, AccessFlags::REMOTE_READ)
                .unwrap_err(),
            KeyError::BadKey
        );
    }

    #[test]
    fn a_fast_reg_range_in_a_later_segment_skips_the_earlier_ones() {
        let mut t = MrTable::default();
        let mut rng = SplitMix::new(3);
        let m1 = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
        let m2 = Arc::new(MemorySource::Owned(MrMemory::new(8192).unwrap()));
        let seg = |memory: &Arc<MemorySource>, offset, len| Segment {
            memory: memory.clone(),
            offset,
            len,
        };
        let backing = Backing::FastReg {
            max_pages: 3,
            valid: true,
            mapping: Some(Mapping {
                segments: vec![seg(&m1, 0, 4096), seg(&m2, 0, 4096), seg(&m2, 4096, 4096)],
            }),
        };
        let key = t
            .insert(&mut rng, PdId(1), AccessFlags::REMOTE_WRITE, 0x20000, 3 * 4096, backing)
            .unwrap();
        // 8 bytes 10 bytes into the second segment: the first is skipped
        // whole, and the range starts 10 bytes into the second.
        let r = t
            .check_remote(key, PdId(1), 5, 0x20000 + 4096 + 10, 8, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .unwrap();
        r.write(&[7u8; 8]).unwrap();
        let mut b = [0u8; 20];
        m2.read_at(0, &mut b).unwrap();
        assert_eq!(b, [[0u8; 10].as_slice(), &[7; 8], &[0; 2]].concat()[..]);
        // Into the third segment, across none.
        let r = t
            .check_remote(key, PdId(1), 5, 0x20000 + 2 * 4096 + 4, 4, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .unwrap();
        r.write(&[9u8; 4]).unwrap();
        let mut b = [0u8; 4];
        m2.read_at(4096 + 4, &mut b).unwrap();
        assert_eq!(b, [9; 4]);
        let mut b = [0u8; 8];
        m1.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0; 8], "the first segment untouched");
    }
}
