//! The ULP layer: what every storage or RPC protocol over RDMA (NFS/RDMA,
//! iSER, SRP, NVMe-oF) writes again, factored once, over either backend.
//!
//! - **Completion callbacks** ([`UlpQp::post`], [`UlpQp::post_recv`]): a
//!   request carries a closure instead of a `wr_id`; the layer owns the
//!   ids. A signaled request calls its callback once; an unsignaled one
//!   calls nothing on success; every error and flush calls the callback of
//!   every request it completes, exactly once, unsignaled ones included;
//!   closing or dropping a QP flushes what it has in flight and runs those
//!   callbacks before it is gone. A completion that belongs to no request
//!   is counted (and its error handed to a sink), never dropped silently.
//! - **Poll contexts**: direct ([`UlpCq::poll`] with a budget,
//!   [`UlpCq::wait`]), a worker thread per CQ ([`CqWorker`]), a shared
//!   pool of CQs ([`CqPool`]), and a [`WrFuture`] per request for any
//!   executor (woken by the CQ's worker, which sleeps on the completion
//!   channel's descriptor).
//! - **Read/write contexts** ([`UlpQp::rw`], [`UlpQp::expose`]): plain
//!   SGEs or a fast-registration chain REG_MR → op → LOCAL_INV with only
//!   the last WR signaled, posted all or nothing, keys rotated at every
//!   use; [`RwCaps`] says whether the backend has fast registration (the
//!   hardware backend does not in user space: plain SGEs and plain MR
//!   pools then).
//! - **Send-queue budget** ([`SqBudget`]): a QP created through the layer
//!   is sized from exactly what its contexts need, never clamped; a
//!   [`SqReservation`] taken before building a chain guarantees room.
//! - **READ depth**: READs and atomics in flight per QP never exceed
//!   `max_rd_atomic`; more wait in the layer and go out as earlier ones
//!   complete.
//! - **MR pools** ([`MrPool`]): pre-registered fast-registration and
//!   plain MRs, taken and returned without a verb.
//!
//! # Cost per operation
//!
//! The layer sits on every post and every poll, so its fast path is kept
//! short:
//!
//! - **Locks**: the state of a QP (the tracker: both queues' rings of
//!   requests, slots, READ credits) and of a CQ poll (the completion
//!   buffer and the map of attached QPs) is guarded, on soft devices, by
//!   the device's engine lock: a post does its bookkeeping inside the
//!   verb's own hold of that lock, and so does a poll, so the layer adds
//!   no lock to either. On the hardware backend (whose locks are inside
//!   libibverbs), a mutex per QP and one per CQ poll:
//!   a post takes the QP's once (the verbs post and the bookkeeping under
//!   it), a poll takes the CQ's once and the QP's once per run of that
//!   QP's completions.
//! - **Allocations**: none for the common request, a [`UlpWr`] over one
//!   buffer posted with [`UlpQp::post`] (a [`Chain`] keeps one WR inline,
//!   an [`Sgl`] one buffer): its callback is stored inline in the
//!   request (closures of up to four words; larger ones are boxed once),
//!   the request keeps only that buffer's MR (none for a buffer of a
//!   `'static` MR, [`LocalBuf::from_static`]: no reference count per
//!   request), and the buffer its checked scatter entry, so the WR is
//!   built without asking the MR again; each
//!   queue is a ring of slots indexed by the sequence number the `wr_id`
//!   carries, the request in the slot of its (last) WR, so a completion
//!   finds it without a lookup; the completion buffer (the CQ's) and the
//!   list of finished requests (the polling thread's, whose callbacks run
//!   in place) are reused. Chains of several WRs, several buffers, registrations,
//!   pooled MRs and the first error of a multi-WR request go to a part of
//!   the request that is allocated only for them. A request is a few
//!   dozen bytes (it moves into its slot and out to the poller).
//! - **A lone completion skips the list**: a poll that reads one
//!   completion, the success of its queue's oldest request (of the QP of
//!   the CQ's last completion, with nothing waiting for READ credits), takes
//!   the request's callback and MR out of its slot and calls it where it
//!   lies after the locks, in line in the poll, without touching the
//!   polling thread's list of finished requests (a thread-local flag says
//!   the list is empty: nothing left by a panicking callback, no poll up
//!   the stack running it). The one-buffer post is in line in its caller
//!   too, and a plain WR's MR is moved out of it without the drop glue of
//!   the rest.
//! - **Callbacks run outside every lock**, after the poll has retired all
//!   it read: a callback may post, poll or close.
//!
//! # Examples
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use softverbs::ulp::{UlpCq, UlpQp, UlpQpInit, UlpWr};
//!
//! let ctx = softverbs::soft::embedded_default()?[0].open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = UlpCq::new(&ctx, 256)?;
//! let qp = UlpQp::create(&pd, &cq, &cq, &UlpQpInit::default())?;
//! // The QP is in RESET: a post fails and hands the callback back.
//! let called = Arc::new(AtomicU32::new(0));
//! let c = called.clone();
//! let err = qp.post(vec![UlpWr::send_inline(b"hi")], move |_| { c.fetch_add(1, Ordering::SeqCst); }).unwrap_err();
//! assert!(err.callback.is_some());
//! assert_eq!(called.load(Ordering::SeqCst), 0);
//! # Ok::<(), softverbs::verbs::Error>(())
//! ```

mod cb;
mod cq;
mod future;
mod guard;
mod poll;
mod pool;
mod qp;
mod rw;
mod wr;

pub use cq::{CqStats, StraySink, UlpCq};
pub use future::WrFuture;
pub use poll::{CqPool, CqWorker};
pub use pool::{MrPool, PoolKind, PooledMr};
pub use qp::{QpStats, SqBudget, SqReservation, UlpPostError, UlpQp, UlpQpInit};
pub use rw::{Exposed, RegMode, RwCaps, RwDir, RwOptions, RwPosted};
pub use wr::{Callback, Chain, LocalBuf, Sgl, UlpOp, UlpWr};
