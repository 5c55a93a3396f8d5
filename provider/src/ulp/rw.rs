//! Read/write contexts: from a local scatter list and a remote range,
//! build and post what moves the data (plain SGEs, or a fast
//! registration chain REG_MR → op → LOCAL_INV), and expose local memory to
//! a peer through a fast-registration MR with a fresh key each time.

use std::fmt;

use super::cb::Cb;
use super::pool::{MrPool, PoolKind, PooledMr};
use super::qp::{UlpPostError, UlpQp};
use super::wr::{LocalBuf, Sgl, UlpOp, UlpWr};
use crate::verbs::{verr, AccessFlags, Error, ErrorKind, Pd, RemoteAddr, Result, Sge, WorkCompletion, PAGE_SIZE};

/// What read/write contexts can do on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwCaps {
    /// Whether fast registration (REG_MR work requests) is available. The
    /// hardware backend has none in user space (ibverbs has no REG_MR
    /// WR): contexts then use plain SGEs only, split over several WRs as
    /// needed, and memory a peer must reach is registered ahead of time
    /// (a plain [`MrPool`]).
    pub fast_reg: bool,
    /// Scatter entries per send WR (the device's `max_sge`).
    pub max_sge: u32,
    /// Scatter entries per READ (`max_sge_rd`).
    pub max_sge_rd: u32,
    /// Pages per fast-registration MR (0 without fast registration).
    pub max_fast_reg_pages: u32,
}

impl RwCaps {
    /// Probes `pd`'s device (allocates and frees one fast-registration MR
    /// to see whether the backend has them).
    ///
    /// # Errors
    ///
    /// `query_device`'s errors; an allocation failure other than
    /// `EOPNOTSUPP`.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let caps = softverbs::ulp::RwCaps::probe(&ctx, &ctx.alloc_pd()?)?;
    /// assert!(caps.fast_reg); // the soft provider has REG_MR WRs
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn probe(ctx: &crate::verbs::Context, pd: &Pd) -> Result<RwCaps> {
        let attr = ctx.query_device()?;
        let fast_reg = attr.max_fast_reg_page_list_len > 0
            && match pd.alloc_fast_reg_mr(1) {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::NotSupported => false,
                Err(e) => return Err(e),
            };
        Ok(RwCaps {
            fast_reg,
            max_sge: attr.max_sge,
            max_sge_rd: attr.max_sge_rd,
            max_fast_reg_pages: if fast_reg { attr.max_fast_reg_page_list_len } else { 0 },
        })
    }
}

/// Which direction a context moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwDir {
    /// RDMA READ: remote → local.
    Read,
    /// RDMA WRITE: local → remote.
    Write,
}

/// How a context registers the local side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RegMode {
    /// Plain SGEs if the list fits one WR, else fast registration if a
    /// pool is given, else plain SGEs over several WRs.
    #[default]
    Auto,
    /// Always fast registration (also for a READ's sink on iWARP-like
    /// devices, which need it registered with remote write).
    FastReg,
    /// Always plain SGEs.
    Plain,
}

/// Options of a read/write context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RwOptions {
    /// Registration choice.
    pub mode: RegMode,
    /// Register a READ's sink with remote write as well (iWARP reads land
    /// through an rkey).
    pub iwarp_read_sink: bool,
    /// Invalidate lazily: the chain is REG_MR → op (signaled), the
    /// callback runs when the op is done, and the LOCAL_INV goes out
    /// after it, off the request's path (its send slot is reserved with
    /// the chain); the MR returns to the pool when the LOCAL_INV has
    /// completed.
    pub lazy_invalidate: bool,
}

/// What a context posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwPosted {
    /// WRs in the chain.
    pub wrs: u32,
    /// Whether it used fast registration.
    pub fast_reg: bool,
    /// The key the registration used (fast registration only).
    pub key: Option<u32>,
}

fn total_len(local: &[LocalBuf]) -> Result<u32> {
    local
        .iter()
        .try_fold(0u32, |a, b| a.checked_add(b.len()))
        .ok_or_else(|| verr!(PostSend, InvalidArgument, "a context of more than 2^32-1 bytes"))
}

fn err(error: Error, cb: Cb) -> UlpPostError {
    UlpPostError {
        error,
        callback: Some(cb.into_boxed()),
    }
}

/// Maps `local` onto a pooled fast-registration MR; the MR, its next key
/// and the mapped iova/length.
fn map(pool: &MrPool, local: &[LocalBuf]) -> Result<(PooledMr, u32, u64, u32)> {
    if !matches!(pool.kind(), PoolKind::FastReg { .. }) {
        return Err(verr!(
            MapMrPages,
            InvalidArgument,
            "the pool holds no fast-registration MRs"
        ));
    }
    let p = pool.get().ok_or_else(|| {
        verr!(
            AllocMr,
            NoMemory,
            "all {} fast-registration MRs of the pool are in use",
            pool.total()
        )
    })?;
    let sges: Vec<Sge<'_>> = local.iter().map(LocalBuf::sge).collect();
    let n = p.mr().map_pages(&sges, PAGE_SIZE as u32)?;
    if n != local.len() {
        return Err(verr!(
            MapMrPages,
            InvalidArgument,
            "only {n} of {} entries map onto one fast-registration MR (inner boundaries must be page aligned, and the pages fit the MR)",
            local.len()
        ));
    }
    let key = p.mr().next_key();
    let (iova, len) = (p.mr().addr(), total_len(local)?);
    Ok((p, key, iova, len))
}

impl UlpQp {
    /// Posts a read/write context: moves the data between `local` and
    /// `remote` in the direction `dir`, registering as `opts` says, as one
    /// chain posted all or nothing, with only its last WR signaled; `cb`
    /// runs once when it is done (or failed).
    ///
    /// With fast registration the chain is REG_MR (a fresh key byte: the
    /// key rotates at every use) → the op over the registered range →
    /// LOCAL_INV (eager invalidation: the MR is free again, and back in
    /// the pool, when `cb` has run), or, with
    /// [`RwOptions::lazy_invalidate`], REG_MR → op, the LOCAL_INV
    /// following once `cb` has run.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an empty list, a READ into an MR without local write,
    /// a list that cannot be mapped with [`RegMode::FastReg`]; `ENOMEM`
    /// if the pool is empty or the send queue has no room; the post's
    /// errors. `cb` comes back uncalled.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(qp: &softverbs::ulp::UlpQp, pool: &softverbs::ulp::MrPool, local: Vec<softverbs::ulp::LocalBuf>, remote: softverbs::verbs::RemoteAddr) -> Result<(), softverbs::ulp::UlpPostError> {
    /// use softverbs::ulp::{RwDir, RwOptions};
    /// let posted = qp.rw(RwDir::Read, local, remote, Some(pool), RwOptions::default(), |wc| {
    ///     assert!(wc.is_success());
    /// })?;
    /// println!("{} WRs, fast registration: {}", posted.wrs, posted.fast_reg);
    /// # Ok(()) }
    /// ```
    pub fn rw(
        &self,
        dir: RwDir,
        local: impl Into<Sgl>,
        remote: RemoteAddr,
        pool: Option<&MrPool>,
        opts: RwOptions,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<RwPosted, UlpPostError> {
        let cb = Cb::new(cb);
        let local = local.into();
        if local.is_empty() {
            return Err(err(
                verr!(PostSend, InvalidArgument, "a context with no local entries"),
                cb,
            ));
        }
        if let Err(e) = total_len(&local) {
            return Err(err(e, cb));
        }
        if dir == RwDir::Read
            && local
                .iter()
                .any(|b| !b.mr().access().contains(AccessFlags::LOCAL_WRITE))
        {
            return Err(err(
                verr!(
                    PostSend,
                    InvalidArgument,
                    "a READ's sink must be registered with LOCAL_WRITE"
                ),
                cb,
            ));
        }
        let cap = self.qp().cap();
        let per_wr = cap.max_send_sge.max(1) as usize;
        let fast = match opts.mode {
            RegMode::Plain => false,
            RegMode::FastReg => true,
            RegMode::Auto => (local.len() > per_wr || (dir == RwDir::Read && opts.iwarp_read_sink)) && pool.is_some(),
        };
        let op = |remote: RemoteAddr| match dir {
            RwDir::Read => UlpOp::Read(remote),
            RwDir::Write => UlpOp::Write(remote),
        };
        if fast {
            let Some(pool) = pool else {
                return Err(err(
                    verr!(PostSend, InvalidArgument, "fast registration asked without a pool"),
                    cb,
                ));
            };
            let mapped = match map(pool, &local) {
                Ok(m) => Some(m),
                Err(e) if opts.mode == RegMode::FastReg => return Err(err(e, cb)),
                Err(_) => None,
            };
            if let Some((pooled, key, iova, len)) = mapped {
                let mr = pooled.mr().clone();
                let mut access = AccessFlags::LOCAL_WRITE;
                if dir == RwDir::Read && opts.iwarp_read_sink {
                    access |= AccessFlags::REMOTE_WRITE;
                }
                let mut opwr = UlpWr::new(op(remote), local);
                opwr.frmr_sge = Some((iova, len, key));
                opwr.frmr = Some(mr.clone());
                let (chain, lazy) = if opts.lazy_invalidate {
                    (vec![UlpWr::reg_mr(mr, key, access), opwr], Some(key))
                } else {
                    (vec![UlpWr::reg_mr(mr, key, access), opwr, UlpWr::local_inv(key)], None)
                };
                self.submit(chain.into(), Some(cb), true, 0, Some(pooled), lazy)?;
                return Ok(RwPosted {
                    wrs: 3,
                    fast_reg: true,
                    key: Some(key),
                });
            }
        }
        // Plain SGEs: one WR per `per_wr` entries, each at the next remote
        // offset; a list that fits one WR goes in it as it is.
        if local.len() <= per_wr {
            self.submit(UlpWr::new(op(remote), local).into(), Some(cb), true, 0, None, None)?;
            return Ok(RwPosted {
                wrs: 1,
                fast_reg: false,
                key: None,
            });
        }
        let mut chain = Vec::new();
        let mut off = 0u64;
        for group in local.chunks(per_wr) {
            let len: u64 = group.iter().map(|b| u64::from(b.len())).sum();
            chain.push(UlpWr::new(
                op(RemoteAddr {
                    addr: remote.addr + off,
                    rkey: remote.rkey,
                }),
                group.to_vec(),
            ));
            off += len;
        }
        let wrs = chain.len() as u32;
        self.submit(chain.into(), Some(cb), true, 0, None, None)?;
        Ok(RwPosted {
            wrs,
            fast_reg: false,
            key: None,
        })
    }

    /// Exposes `local` to the peer through a fast-registration MR of
    /// `pool` with `access` (remote read and/or write) and a fresh key:
    /// posts the REG_MR and returns the range to send to the peer. `cb`
    /// runs once the registration is done (or failed). The range stays
    /// valid until [`UlpQp::invalidate`] (or the peer's SEND with
    /// invalidate, see [`Exposed::remotely_invalidated`]).
    ///
    /// To register without a completion of its own, in front of the SEND
    /// that carries the range to the peer, see [`UlpQp::expose_wr`].
    ///
    /// # Errors
    ///
    /// As [`UlpQp::rw`].
    pub fn expose(
        &self,
        pool: &MrPool,
        local: impl Into<Sgl>,
        access: AccessFlags,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<Exposed, UlpPostError> {
        let cb = Cb::new(cb);
        let (exposed, wr) = match self.expose_wr(pool, local, access) {
            Ok(e) => e,
            Err(e) => return Err(err(e, cb)),
        };
        self.submit(wr.into(), Some(cb), true, 0, None, None)?;
        Ok(exposed)
    }

    /// Exposes `local` as [`UlpQp::expose`] does, without posting: maps it
    /// onto a fast-registration MR of `pool` with a fresh key and returns
    /// the exposure and its REG_MR work request. Post that WR first in a
    /// chain of the caller's, in front of the SEND that carries the range
    /// to the peer (as NVMe-oF and iSER hosts do): the registration then
    /// costs no completion of its own, and a failure of either WR calls
    /// the chain's callback. The range is valid once the REG_MR has
    /// executed, which the QP's ordering guarantees before the SEND.
    ///
    /// If the WR is never posted (or its post fails), dropping the
    /// [`Exposed`] deregisters the MR, as it does after an expose.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an empty list, a pool without fast-registration MRs
    /// or a list that cannot be mapped onto one; `ENOMEM` if the pool is
    /// empty.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(qp: &softverbs::ulp::UlpQp, pool: &softverbs::ulp::MrPool, buf: softverbs::ulp::LocalBuf) -> softverbs::verbs::Result<()> {
    /// use softverbs::ulp::UlpWr;
    /// use softverbs::verbs::AccessFlags;
    /// let (exposed, reg) = qp.expose_wr(pool, buf, AccessFlags::REMOTE_WRITE)?;
    /// let r = exposed.remote();
    /// let mut cmd = r.addr.to_le_bytes().to_vec();
    /// cmd.extend_from_slice(&r.rkey.to_le_bytes());
    /// // REG_MR, then the command: only the SEND is signaled.
    /// qp.post(vec![reg, UlpWr::send_inline(&cmd)], |wc| assert!(wc.is_success()))
    ///     .map_err(|e| e.error)?;
    /// # drop(exposed);
    /// # Ok(()) }
    /// ```
    pub fn expose_wr(&self, pool: &MrPool, local: impl Into<Sgl>, access: AccessFlags) -> Result<(Exposed, UlpWr)> {
        let local: Sgl = local.into();
        if local.is_empty() {
            return Err(verr!(PostSend, InvalidArgument, "nothing to expose"));
        }
        let (pooled, key, iova, len) = map(pool, &local)?;
        let mr = pooled.mr().clone();
        let mut wr = UlpWr::reg_mr(mr, key, access | AccessFlags::LOCAL_WRITE);
        // The registered memory stays alive with the WR (while the MR's
        // mapping may be used) and with the exposure.
        wr.sgl = local.clone();
        let exposed = Exposed {
            pooled: Some(pooled),
            local,
            remote: RemoteAddr { addr: iova, rkey: key },
            len,
        };
        Ok((exposed, wr))
    }

    /// Invalidates an exposed range (LOCAL_INV, fenced): once `cb` has run
    /// the peer's key is dead and the MR is back in its pool.
    ///
    /// # Errors
    ///
    /// As [`UlpQp::post`].
    pub fn invalidate(
        &self,
        mut exposed: Exposed,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<(), UlpPostError> {
        let pooled = exposed.pooled.take().expect("present until consumed");
        let mut wr = UlpWr::local_inv(exposed.remote.rkey);
        wr.sgl = std::mem::take(&mut exposed.local);
        self.submit(wr.into(), Some(Cb::new(cb)), true, 0, Some(pooled), None)
    }
}

/// Local memory exposed to a peer ([`UlpQp::expose`]). Dropping it without
/// [`UlpQp::invalidate`] deregisters the MR (the peer's key dies with it)
/// instead of returning it to the pool.
pub struct Exposed {
    pooled: Option<PooledMr>,
    local: Sgl,
    remote: RemoteAddr,
    len: u32,
}

impl fmt::Debug for Exposed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exposed")
            .field("remote", &self.remote)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Exposed {
    /// Where the peer reaches it (address and rkey).
    pub fn remote(&self) -> RemoteAddr {
        self.remote
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The peer invalidated the key itself (a receive completed with
    /// `WITH_INV` and this rkey: [`WorkCompletion::invalidated_rkey`]):
    /// the MR goes back to its pool without a LOCAL_INV.
    ///
    /// # Errors
    ///
    /// `EINVAL` (and the exposure back) if `rkey` is not this range's key.
    pub fn remotely_invalidated(mut self, rkey: u32) -> std::result::Result<(), Exposed> {
        if rkey != self.remote.rkey {
            return Err(self);
        }
        drop(self.pooled.take());
        Ok(())
    }
}

impl Drop for Exposed {
    fn drop(&mut self) {
        if let Some(mut p) = self.pooled.take() {
            p.poison();
        }
    }
}
