//! Pools of pre-registered MRs: fast-registration MRs for read/write
//! contexts and plain MRs (bounce buffers) where the backend has no fast
//! registration. Getting and putting one is a lock and a `Vec` push or
//! pop: no verb on the fast path.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::verbs::{AccessFlags, Mr, Pd, Result};

/// What a pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Fast-registration MRs able to map `max_pages` 4 KiB pages each.
    FastReg {
        /// Pages per MR.
        max_pages: u32,
    },
    /// Plain registered buffers of `len` bytes.
    Plain {
        /// Bytes per buffer.
        len: usize,
        /// Their access rights.
        access: AccessFlags,
    },
}

struct PoolInner {
    kind: PoolKind,
    free: Mutex<Vec<Arc<Mr>>>,
    total: usize,
    discarded: AtomicU64,
}

/// A pool of pre-registered MRs of one PD. Cheap to clone (shared).
#[derive(Clone)]
pub struct MrPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for MrPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrPool")
            .field("kind", &self.inner.kind)
            .field("total", &self.inner.total)
            .field("available", &self.available())
            .finish()
    }
}

impl MrPool {
    /// `count` fast-registration MRs of `max_pages` pages each, allocated
    /// now.
    ///
    /// # Errors
    ///
    /// Those of [`Pd::alloc_fast_reg_mr`]: `EOPNOTSUPP` where the backend
    /// has no user-space fast registration (ibverbs), `EINVAL` above the
    /// device's page list length.
    ///
    /// # Examples
    ///
    /// ```
    /// let pd = softverbs::soft::embedded_default()?[0].open()?.alloc_pd()?;
    /// let pool = softverbs::ulp::MrPool::fast_reg(&pd, 4, 16)?;
    /// let mr = pool.get().unwrap();
    /// assert_eq!(pool.available(), 3);
    /// drop(mr);
    /// assert_eq!(pool.available(), 4);
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn fast_reg(pd: &Pd, count: usize, max_pages: u32) -> Result<MrPool> {
        let mrs = (0..count)
            .map(|_| pd.alloc_fast_reg_mr(max_pages).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(MrPool::from_mrs(PoolKind::FastReg { max_pages }, mrs))
    }

    /// `count` plain buffers of `len` bytes registered with `access`.
    ///
    /// # Errors
    ///
    /// Those of [`Pd::alloc_mr`].
    pub fn plain(pd: &Pd, count: usize, len: usize, access: AccessFlags) -> Result<MrPool> {
        let mrs = (0..count)
            .map(|_| pd.alloc_mr(len, access).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(MrPool::from_mrs(PoolKind::Plain { len, access }, mrs))
    }

    fn from_mrs(kind: PoolKind, mrs: Vec<Arc<Mr>>) -> MrPool {
        MrPool {
            inner: Arc::new(PoolInner {
                kind,
                total: mrs.len(),
                free: Mutex::new(mrs),
                discarded: AtomicU64::new(0),
            }),
        }
    }

    /// What the pool holds.
    pub fn kind(&self) -> PoolKind {
        self.inner.kind
    }

    /// An MR, if one is free. It comes back when the [`PooledMr`] drops.
    pub fn get(&self) -> Option<PooledMr> {
        let mr = self.inner.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(PooledMr {
            mr: Some(mr),
            pool: self.inner.clone(),
            poisoned: false,
        })
    }

    /// MRs free now.
    pub fn available(&self) -> usize {
        self.inner.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// MRs the pool was created with.
    pub fn total(&self) -> usize {
        self.inner.total
    }

    /// MRs deregistered instead of returned, because they may have been
    /// left registered (a chain only partly posted, an exposed range
    /// dropped without invalidation).
    pub fn discarded(&self) -> u64 {
        self.inner.discarded.load(Ordering::Relaxed)
    }
}

/// An MR taken from a [`MrPool`]; back to the pool on drop.
pub struct PooledMr {
    mr: Option<Arc<Mr>>,
    pool: Arc<PoolInner>,
    poisoned: bool,
}

impl fmt::Debug for PooledMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledMr")
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl PooledMr {
    /// The MR.
    pub fn mr(&self) -> &Arc<Mr> {
        self.mr.as_ref().expect("present until drop")
    }

    /// Marks the MR as not reusable: it is deregistered instead of going
    /// back to the pool.
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
    }
}

impl Drop for PooledMr {
    fn drop(&mut self) {
        let Some(mr) = self.mr.take() else { return };
        if self.poisoned {
            self.pool.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push(mr);
    }
}
