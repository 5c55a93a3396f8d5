//! A drop-in `libibverbs.so.1` backed by the softverbs soft provider: the
//! verbs emulator for C programs.
//!
//! Build with `cargo build -p softverbs-ibverbs --release`; the library is
//! `libsoftverbs_ibverbs.so` in the target directory, linked with SONAME
//! `libibverbs.so.1` and the symbol versions of rdma-core's libibverbs
//! (`IBVERBS_1.0` … `IBVERBS_1.14`, `IBVERBS_PRIVATE_34`). Put it in a
//! directory as `libibverbs.so.1` (the script `emulator/ibverbs/mklibdir.sh`
//! does this) and run any program linked against the system libibverbs
//! with `LD_LIBRARY_PATH=<dir>`:
//!
//! ```text
//! emulator/ibverbs/mklibdir.sh /tmp/sv        # builds, then links the names
//! LD_LIBRARY_PATH=/tmp/sv ibv_devinfo -v
//! LD_LIBRARY_PATH=/tmp/sv ibv_rc_pingpong -g 0 &
//! LD_LIBRARY_PATH=/tmp/sv ibv_rc_pingpong -g 0 127.0.0.1
//! ```
//!
//! # Devices
//!
//! The first `ibv_get_device_list` of a process creates one soft device
//! (RoCEv2 over UDP, with shared-memory channels to soft devices of other
//! processes on the same host). Environment variables choose it:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `SOFTVERBS_DEVICE` | device name | `softverbs_0` |
//! | `SOFTVERBS_ADDR` | local IP address to bind | `127.0.0.1` |
//! | `SOFTVERBS_IFACE` | bind every address of this interface instead | unset |
//! | `SOFTVERBS_PORT` | UDP port: `auto` (4791 if free, else a private port whose GID encodes it), `private` (a free port of 0x8000–0xBFFF and its private GID), or a number | `private` on a loopback address, else `auto` |
//! | `SOFTVERBS_LINK` | `auto` (UDP + shared memory to local peers), `udp`, `shm` (shared memory only) | `auto` |
//! | `SOFTVERBS_ENGINE` | `thread` (the library's progress thread, engine inline), `inline` (no thread: progress only inside verbs), `provider-thread` (the soft provider's own progress thread) | `thread` |
//! | `SOFTVERBS_SPIN_US` | with `thread`: how long the library's thread keeps reading the link after serving traffic while the application's threads are blocked; with `provider-thread`: how long that thread busy-polls after work before sleeping | `50` with `thread`, `0` with `provider-thread` |
//! | `SOFTVERBS_UNPLUG_AFTER_MS` | hot-unplug the device this many ms after it was created (see Hotplug) | unset |
//!
//! A program sees its GID with `ibv_query_gid` as usual and exchanges it
//! with its peer out of band (`-g 0` for the rdma-core examples, `-x 0`
//! for perftest). On loopback every process takes a private port, so all
//! GIDs have the same form: perftest refuses a peer whose GID is
//! IPv4-mapped when its own is not, which `auto` would give the second
//! process on a host. For another host, rxe or a RoCE NIC, bind a real
//! address (`SOFTVERBS_ADDR`/`SOFTVERBS_IFACE`): `auto` then takes 4791
//! and the standard GID.
//!
//! # Progress
//!
//! The engine runs inline: a busy-polling application reads the link
//! itself inside `ibv_poll_cq` (the fastest path, and the only one that
//! keeps a busy-polling pair fast on a 2-core machine). Next to it, by
//! default, one library thread per device sleeps in `ppoll(2)` on the
//! link's descriptors and drives the device whenever nobody else does, so
//! a passive RDMA WRITE/READ target that never calls a verb is served, a
//! receiver that spins on memory (perftest's `ib_write_lat`) sees each
//! WRITE within microseconds, timers run, and a thread blocked in
//! `ibv_get_cq_event` is woken. The thread never spins (on a small machine
//! it could only run by taking the core of a spinning application
//! thread); it asks for a short scheduler slice, so that its wake-up
//! preempts a spinning thread at once, and adapts its sleep: data it
//! finds that the application, although it ran, left unread (it judges by
//! the application threads' CPU time since their last `ibv_poll_cq`)
//! brings its timeout down to 20 µs, and for a while makes an
//! `ibv_poll_cq` that returns completions announce the thread as sleeping
//! again (the shared-memory link rings a sleeping reader's doorbell, and
//! an application's poll withdraws that announcement); quiet wake-ups
//! double the timeout up to 1 ms, 20 ms when idle. While the application
//! keeps polling CQs the thread wakes about once a millisecond and leaves
//! the link to it. Its costs: traffic that arrives while no application
//! thread is in a verb waits for the thread's wake-up (a context switch),
//! and an idle device wakes it every 20 ms for timers.
//! When it served traffic and the application's threads did not run
//! since its last wake-up (a passive target blocked in a TCP read, as
//! perftest's bandwidth server is), it keeps reading the link for
//! `SOFTVERBS_SPIN_US` (50 µs) of quiet before sleeping, so that a
//! stream of WRITEs costs one wake-up per burst rather than one per
//! message; it stops at once when an application thread polls a CQ or
//! runs. `SOFTVERBS_ENGINE=inline` removes the thread (nothing progresses while
//! no thread is in a verb); `provider-thread` uses the soft provider's
//! edge-triggered progress thread instead.
//!
//! # Hotplug
//!
//! [`softverbs_remove_device`] (exported, C ABI; a test or a harness
//! reaches it with `dlsym`), or `SOFTVERBS_UNPLUG_AFTER_MS` for an
//! unmodified program, removes a device from outside the application as
//! the kernel disassociates one: each open
//! context gets `IBV_EVENT_DEVICE_FATAL`, verbs fail with `ENODEV`, queue
//! pairs go to the error state, and `ibv_close_device` and the destroy
//! verbs still succeed.
//!
//! # rdma_cm
//!
//! The library also implements librdmacm's `rdma_*` calls (module
//! [`rdmacm`], over the soft provider's connection manager), exported as
//! `__softverbs_rdma_*`; the drop-in `librdmacm.so.1` of crate
//! `softverbs-rdmacm` gives them their rdma-core names and versions
//! (`mklibdir.sh` links it too). rdma_cm resolves IP addresses to GIDs, so
//! give each process its own address on port 4791
//! (`SOFTVERBS_ADDR=127.0.7.1 SOFTVERBS_PORT=4791`).
//! [`rdmacm::softverbs_remove_addr`] (exported, C ABI, like
//! [`softverbs_remove_device`]) reports an address removed from the
//! device's interface: the ids bound through it get
//! `RDMA_CM_EVENT_ADDR_CHANGE`.
//!
//! # What is not supported
//!
//! Verbs the soft provider cannot honour return `EOPNOTSUPP` (or `NULL`
//! with `errno` = `EOPNOTSUPP`), as libibverbs does for a provider that
//! lacks them: XRC, flow steering, WQs and RSS, device memory, counters,
//! parent domains and thread domains, dmabuf MRs, on-demand paging, TSO,
//! multicast (`ibv_attach_mcast`), ECE. The `IBVERBS_1.0` verbs of the
//! pre-2006 ABI (`ibv_get_device_list@IBVERBS_1.0` and the 32 others that
//! rdma-core keeps, bound only by binaries linked against a libibverbs of
//! that time) work as rdma-core's do: 1.0 objects wrapping current ones,
//! and a 1.0 operation table for the data path. The `IBVERBS_PRIVATE_34`
//! symbols exist so that provider libraries linked against libibverbs
//! (libmlx5, libefa, librdmacm, which perftest links) load; the provider
//! interface itself is not implemented (drivers are never loaded) and its
//! calls fail with `EOPNOTSUPP`. The Rust implementations behind the
//! versioned names are also exported, unversioned, as `__softverbs_*`
//! (rustc exports every `#[no_mangle]` function); nothing should call them.
//! Completion-channel and async-event descriptors (epoll instances over the
//! provider's event descriptors: for `poll`/`epoll`/`select`, not `read`)
//! are readable exactly when an event is pending and start blocking; with
//! `O_NONBLOCK` set on them (`fcntl`),
//! `ibv_get_cq_event`/`ibv_get_async_event` return -1 with `EAGAIN` when
//! none is, as libibverbs documents. `ibv_destroy_cq` with unacknowledged
//! events fails with `EBUSY` instead of waiting for them.
//! `ibv_wr_complete` posts its batch as one unit, all or nothing: the
//! provider checks every work request of the batch (QP type, SGE count,
//! inline size, atomic shape, message size, room in the send queue)
//! before it queues any, and a refusal posts none of them.

// The C entry points are `pub` for the linker, not for Rust callers.
#![allow(unreachable_pub)]

mod compat;
mod data;
mod ex;
pub mod ffi;
mod objects;
mod progress;
pub mod rdmacm;
mod state;
mod verbs;

pub use state::softverbs_remove_device;

// The versioned names of the exported functions (generated by build.rs
// from `symbols.txt`): each is a `jmp` to the Rust function, renamed
// to `name@@VERSION` by `.symver`.
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));
