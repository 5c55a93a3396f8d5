//! The memory-region table: 24-bit index + 8-bit key byte, PD and access
//! checks, bounds checks, and device-side memory access (DESIGN §3.1, §3.4).

use std::sync::Arc;

use crate::verbs::{AccessFlags, MemorySource};

use super::{PdId, SplitMix};

/// Why a key check failed; the caller turns it into the status of its side
/// (local: LOC_PROT_ERR; remote: a remote-access NAK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No MR has this key (index unused or stale key byte).
    BadKey,
    /// The MR belongs to another protection domain.
    WrongPd,
    /// The MR lacks a required right.
    Access,
    /// The range is outside the MR.
    Bounds,
}

/// One registered region.
#[derive(Debug)]
pub(crate) struct MrEntry {
    /// Current full key (index << 8 | key byte).
    pub(crate) key: u32,
    pub(crate) pd: PdId,
    pub(crate) access: AccessFlags,
    /// First address (iova) of the region.
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) memory: Arc<MemorySource>,
}

/// A checked range inside an MR: the memory and the offset into it.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) memory: Arc<MemorySource>,
    pub(crate) offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct MrTable {
    entries: Vec<Option<MrEntry>>,
    free: Vec<u32>,
    live: u32,
}

/// Largest index (24 bits; index 0 is never used so that key 0 is invalid).
const MAX_INDEX: u32 = (1 << 24) - 1;

impl MrTable {
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Inserts a region with a fresh key byte; returns the key.
    pub(crate) fn insert(
        &mut self,
        rng: &mut SplitMix,
        pd: PdId,
        access: AccessFlags,
        memory: Arc<MemorySource>,
        iova: u64,
        len: u64,
    ) -> Option<u32> {
        let index = match self.free.pop() {
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
            memory,
        });
        self.live += 1;
        Some(key)
    }

    pub(crate) fn get(&self, key: u32) -> Option<&MrEntry> {
        let index = key >> 8;
        if index == 0 {
            return None;
        }
        self.entries
            .get((index - 1) as usize)?
            .as_ref()
            .filter(|e| e.key == key)
    }

    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        let index = key >> 8;
        if index == 0 {
            return None;
        }
        self.entries
            .get_mut((index - 1) as usize)?
            .as_mut()
            .filter(|e| e.key == key)
    }

    /// Removes the region with this key; the index becomes reusable.
    pub(crate) fn remove(&mut self, key: u32) -> Option<MrEntry> {
        let index = key >> 8;
        if index == 0 {
            return None;
        }
        let slot = self.entries.get_mut((index - 1) as usize)?;
        if slot.as_ref().is_some_and(|e| e.key == key) {
            self.live -= 1;
            // Reuse indexes FIFO-ish: push to the front of the free list's
            // pop order last, so a stale key is unlikely to meet a new MR at
            // the same index soon.
            self.free.insert(0, index);
            slot.take()
        } else {
            None
        }
    }

    /// Checks `len` bytes at `addr` under `key` for `pd` with rights `need`.
    /// A zero-length range needs no valid key (IBTA 9.4.4: zero-length
    /// RDMA needs no R_Key check) and resolves to `None`.
    pub(crate) fn check(
        &self,
        key: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<Resolved>, KeyError> {
        if len == 0 {
            return Ok(None);
        }
        let e = self.get(key).ok_or(KeyError::BadKey)?;
        if e.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !e.access.contains(need) {
            return Err(KeyError::Access);
        }
        let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
        if addr < e.iova || end > e.iova + e.len {
            return Err(KeyError::Bounds);
        }
        let offset = usize::try_from(addr - e.iova).map_err(|_| KeyError::Bounds)?;
        Ok(Some(Resolved {
            memory: e.memory.clone(),
            offset,
        }))
    }

    /// Whether any region belongs to `pd`.
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
        let key = t.insert(&mut rng, PdId(1), access, mem, addr, 4096).unwrap();
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
        assert_eq!(
            t.check(0, PdId(9), 0, 0, AccessFlags::REMOTE_WRITE)
                .unwrap()
                .map(|r| r.offset),
            None
        );
    }

    #[test]
    fn removed_key_is_dead_and_index_reuse_changes_the_key() {
        let (mut t, key, addr) = table_with_one(AccessFlags::LOCAL_WRITE);
        assert!(t.remove(key).is_some());
        assert!(t.remove(key).is_none());
        assert_eq!(
            t.check(key, PdId(1), addr, 1, AccessFlags::empty()).unwrap_err(),
            KeyError::BadKey
        );
        assert_eq!(t.live(), 0);
    }
}
