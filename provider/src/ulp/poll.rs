//! Poll contexts beyond the direct one: a worker thread per CQ, and a
//! pool of CQs (each with its worker) shared by many QPs.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::cq::UlpCq;
use crate::verbs::{verr, Context, Result};

/// Completions a worker handles per turn.
const WORKER_BUDGET: usize = 64;
/// How long a worker sleeps on the channel before looking at its stop
/// flag (a stop never waits longer than this).
const WORKER_TICK: Duration = Duration::from_millis(20);

/// The worker-thread poll context: a thread that sleeps on the CQ's
/// completion channel and runs callbacks as completions arrive. Stops
/// (and joins) on drop.
pub struct CqWorker {
    stop: Arc<AtomicBool>,
    errors: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for CqWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqWorker").finish_non_exhaustive()
    }
}

impl CqWorker {
    /// Starts a worker for `cq`.
    ///
    /// # Errors
    ///
    /// `Io` if the thread cannot be spawned.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let cq = softverbs::ulp::UlpCq::new(&ctx, 64)?;
    /// let worker = softverbs::ulp::CqWorker::spawn(&cq)?;
    /// drop(worker); // stops and joins
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn spawn(cq: &UlpCq) -> Result<CqWorker> {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
        let (s, e, cq) = (stop.clone(), errors.clone(), cq.clone());
        let thread = std::thread::Builder::new()
            .name("ulp-cq".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    if cq.wait(WORKER_BUDGET, Some(WORKER_TICK)).is_err() {
                        // A failed CQ (removed device, overrun) keeps
                        // failing: count it and do not spin on it.
                        e.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(WORKER_TICK);
                    }
                }
            })
            .map_err(|err| verr!(CreateCq, Io, "spawning a CQ worker: {err}"))?;
        Ok(CqWorker {
            stop,
            errors,
            thread: Some(thread),
        })
    }

    /// Poll or wait errors the worker met (each followed by a pause).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

impl Drop for CqWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // A callback that drops the last worker runs on the worker
            // itself: it cannot join itself; the flag stops it.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The shared poll context: a few CQs, each driven by its worker, that
/// many QPs share (the kernel's `ib_cq_pool_get`). A QP takes the CQ with
/// the most free entries.
pub struct CqPool {
    cqs: Vec<(UlpCq, CqWorker)>,
}

impl fmt::Debug for CqPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqPool").field("cqs", &self.cqs.len()).finish()
    }
}

impl CqPool {
    /// `n` CQs of `cqe` entries on `ctx`, each with its worker thread.
    ///
    /// # Errors
    ///
    /// `EINVAL` for `n == 0`; those of [`UlpCq::new`] and
    /// [`CqWorker::spawn`].
    pub fn new(ctx: &Context, n: usize, cqe: u32) -> Result<CqPool> {
        if n == 0 {
            return Err(verr!(CreateCq, InvalidArgument, "a CQ pool needs at least one CQ"));
        }
        let cqs = (0..n)
            .map(|_| {
                let cq = UlpCq::new(ctx, cqe)?;
                let w = CqWorker::spawn(&cq)?;
                Ok((cq, w))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CqPool { cqs })
    }

    /// The CQ with the most free entries, if it has at least `entries`
    /// (what a QP's queues need: [`SqBudget`](super::SqBudget)'s `total +
    /// recv_total`). The entries are promised when the QP is created.
    ///
    /// # Errors
    ///
    /// `ENOMEM` saying the most any CQ of the pool has free.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::ulp::{CqPool, UlpQp, UlpQpInit};
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let pd = ctx.alloc_pd()?;
    /// let pool = CqPool::new(&ctx, 2, 256)?;
    /// let cq = pool.get(130)?;
    /// let qp = UlpQp::create(&pd, &cq, &cq, &UlpQpInit::default())?; // 65 + 65 entries
    /// assert_ne!(pool.get(200)?.free_entries(), cq.free_entries());
    /// # drop(qp);
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn get(&self, entries: u32) -> Result<UlpCq> {
        let best = self
            .cqs
            .iter()
            .map(|(cq, _)| cq)
            .max_by_key(|cq| cq.free_entries())
            .expect("at least one CQ");
        let free = best.free_entries();
        if free < entries {
            return Err(verr!(
                CreateCq,
                NoMemory,
                "{entries} CQ entries asked; the most any CQ of the pool has free is {free}"
            ));
        }
        Ok(best.clone())
    }

    /// The pool's CQs.
    pub fn cqs(&self) -> impl Iterator<Item = &UlpCq> {
        self.cqs.iter().map(|(cq, _)| cq)
    }
}
