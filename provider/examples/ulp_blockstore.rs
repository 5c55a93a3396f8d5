//! A block-storage-like target and initiator written with the ULP layer
//! (`softverbs::ulp`), as NVMe-oF and iSER do it: the initiator exposes
//! its buffer with a fresh fast-registration key per I/O and sends a
//! command; the target moves the data with RDMA WRITE (reads) or RDMA
//! READ (writes) between that buffer and its store, then answers; the
//! initiator invalidates the key and checks the data. I/Os of 4 KiB to
//! 1 MiB, `QD` in flight, on the two embedded in-process soft devices.
//! The same program over raw verbs is `ulp_blockstore_raw.rs`.
//!
//! `cargo run --release -p softverbs --example ulp_blockstore -- 2000 [--shm] [--size <bytes>]`
//! (`--shm`: two devices on 127.0.0.1 over the shared-memory link;
//! `--size`: every I/O of that size)

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use softverbs::soft::link::{shm::ShmMode, udp::UdpConfig};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::ulp::*;
use softverbs::verbs::*;

const MAX_IO: usize = 1 << 20;
const QD: usize = 8;
const STORE: usize = QD * MAX_IO;
const CMD: u32 = 32;

#[allow(dead_code)] // the test includes this file and calls `run`
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ios = args.first().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let size = args
        .iter()
        .position(|a| a == "--size")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    let devs = if args.iter().any(|a| a == "--shm") {
        shm_pair()?
    } else {
        softverbs::soft::embedded_default()?
    };
    let (n, bytes, secs) = run(&devs, ios, size)?;
    println!(
        "{n} I/Os, {:.1} MiB in {secs:.3} s: {:.0} IOPS, {:.1} MiB/s (data checked)",
        bytes as f64 / 1048576.0,
        n as f64 / secs,
        bytes as f64 / 1048576.0 / secs
    );
    Ok(())
}

/// Two devices on 127.0.0.1 whose traffic goes through shared-memory
/// rings (UDP carries only the rendezvous).
#[allow(dead_code)]
pub(crate) fn shm_pair() -> Result<Vec<Arc<SoftDevice>>> {
    let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let pair = PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = |k| format!("blk{}_{pair}_{k}", std::process::id());
    (0..2)
        .map(|k| SoftDevice::create(SoftDeviceConfig::udp_shm(&name(k), UdpConfig::new(lo), ShmMode::Only)?))
        .collect()
}

enum Ev {
    Command(usize),
    Moved(u32, WcStatus),
    Reply(usize),
    Invalidated(usize),
}

thread_local! {
    /// What the callbacks tell the main loop. Callbacks run on the thread
    /// that polls (or closes) their QP's CQ: here the one thread that
    /// drives both sides.
    static EVENTS: RefCell<Vec<Ev>> = const { RefCell::new(Vec::new()) };
}

/// Something a callback tells the main loop.
fn to(f: impl FnOnce(&WorkCompletion) -> Ev + Send + 'static) -> impl FnOnce(&WorkCompletion) + Send {
    move |wc| EVENTS.with_borrow_mut(|e| e.push(f(wc)))
}

/// The events the callbacks left, moved into `evs`.
fn drain(evs: &mut Vec<Ev>) {
    EVENTS.with_borrow_mut(|e| std::mem::swap(e, evs));
}

struct Side {
    pd: Pd,
    cq: UlpCq,
    qp: UlpQp,
    msgs: Arc<Mr>,
}

fn side(ctx: &Context) -> Result<Side> {
    let pd = ctx.alloc_pd()?;
    let cq = UlpCq::new(ctx, 1024)?;
    let init = UlpQpInit {
        send_wr: 2 * QD as u32,
        recv_wr: QD as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        rw_ctxs: QD as u32,
        rw_max_sges: 1,
        rw_fast_reg: true,
        ..UlpQpInit::default()
    };
    let qp = UlpQp::create(&pd, &cq, &cq, &init)?;
    let msgs = Arc::new(pd.alloc_mr(QD * CMD as usize, AccessFlags::LOCAL_WRITE)?);
    Ok(Side { pd, cq, qp, msgs })
}

/// Runs `ios` I/Os (of `size` bytes, or 4 KiB to 1 MiB at random) between
/// the first two of `devs`; returns (I/Os, bytes, seconds).
pub(crate) fn run(devs: &[Arc<SoftDevice>], ios: usize, size: Option<usize>) -> Result<(usize, u64, f64)> {
    let (cctx, tctx) = (devs[0].open()?, devs[1].open()?);
    let (ini, tgt) = (side(&cctx)?, side(&tctx)?);
    connect(&ini.qp, &tgt.qp, tctx.query_gid(1, 0)?)?;
    connect(&tgt.qp, &ini.qp, cctx.query_gid(1, 0)?)?;
    EVENTS.with_borrow_mut(Vec::clear);
    let mut evs = Vec::new();
    // Target: its store, and a receive per command slot.
    let store = Arc::new(tgt.pd.alloc_mr(STORE, AccessFlags::LOCAL_WRITE)?);
    for k in 0..QD {
        post_msg_recv(&tgt, k, Ev::Command)?;
        post_msg_recv(&ini, k, Ev::Reply)?;
    }
    // Initiator: a buffer and a fast-registration MR per slot.
    let pool = MrPool::fast_reg(&ini.pd, QD, (MAX_IO / PAGE_SIZE) as u32)?;
    let bufs: Vec<Arc<Mr>> = (0..QD)
        .map(|_| ini.pd.alloc_mr(MAX_IO, AccessFlags::LOCAL_WRITE).map(Arc::new))
        .collect::<Result<_>>()?;
    let mut model = vec![0u8; STORE];
    let mut slots: Vec<Option<(Io, Option<Exposed>)>> = (0..QD).map(|_| None).collect();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let (mut started, mut done, mut bytes) = (0, 0, 0u64);
    let start = Instant::now();
    for (k, slot) in slots.iter_mut().enumerate().take(ios.min(QD)) {
        *slot = Some(submit(&ini, &pool, &bufs[k], k, &mut model, &mut rng, size)?);
        started += 1;
    }
    while done < ios {
        ini.cq.poll(32)?;
        tgt.cq.poll(32)?;
        drain(&mut evs);
        for ev in evs.drain(..) {
            match ev {
                Ev::Command(k) => serve(&tgt, &store, k)?,
                Ev::Moved(tag, status) => {
                    assert_eq!(status, WcStatus::Success, "data movement of I/O {tag}");
                    let reply = tag.to_le_bytes();
                    tgt.qp.post(UlpWr::send_inline(&reply), check)?;
                }
                Ev::Reply(k) => {
                    let tag =
                        u32::from_le_bytes(ini.msgs.to_vec(k as u64 * u64::from(CMD), 4)?.try_into().unwrap()) as usize;
                    post_msg_recv(&ini, k, Ev::Reply)?;
                    let ex = slots[tag].as_mut().and_then(|s| s.1.take()).expect("I/O in flight");
                    ini.qp.invalidate(ex, to(move |_| Ev::Invalidated(tag)))?;
                }
                Ev::Invalidated(k) => {
                    let (io, _) = slots[k].take().expect("I/O in flight");
                    if !io.write {
                        let got = bufs[k].to_vec(0, io.len)?;
                        assert!(
                            got == model[io.off..io.off + io.len],
                            "read of {} bytes at {}",
                            io.len,
                            io.off
                        );
                    }
                    bytes += io.len as u64;
                    done += 1;
                    if started < ios {
                        slots[k] = Some(submit(&ini, &pool, &bufs[k], k, &mut model, &mut rng, size)?);
                        started += 1;
                    }
                }
            }
        }
    }
    Ok((done, bytes, start.elapsed().as_secs_f64()))
}

/// Callback of a WR whose success the program does not wait for: it must
/// not fail (a flush when the QPs close at the end is fine).
fn check(wc: &WorkCompletion) {
    assert!(wc.is_success() || wc.status == WcStatus::WrFlushErr, "{wc:?}");
}

struct Io {
    write: bool,
    off: usize,
    len: usize,
}

fn post_msg_recv(s: &Side, k: usize, ev: fn(usize) -> Ev) -> Result<()> {
    let buf = LocalBuf::new(&s.msgs, (k * CMD as usize) as u64, CMD)?;
    // A receive completes with a flush when the QP closes at the end:
    // the main loop is gone then and the event is never read.
    s.qp.post_recv(buf, to(move |_| ev(k)))?;
    Ok(())
}

fn submit(
    s: &Side,
    pool: &MrPool,
    buf: &Arc<Mr>,
    tag: usize,
    model: &mut [u8],
    rng: &mut u64,
    size: Option<usize>,
) -> Result<(Io, Option<Exposed>)> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let len = size.unwrap_or(PAGE_SIZE << (next() % 9)); // 4 KiB .. 1 MiB
                                                         // Each slot has its own MiB of the store: I/Os in flight never overlap.
    let off = tag * MAX_IO + (next() as usize % ((MAX_IO - len) / PAGE_SIZE + 1)) * PAGE_SIZE;
    let write = next() % 2 == 0;
    if write {
        let b = next() as u8;
        let data: Vec<u8> = (0..len).map(|i| b.wrapping_add(i as u8)).collect();
        buf.write(0, &data)?;
        model[off..off + len].copy_from_slice(&data);
    }
    let access = if write {
        AccessFlags::REMOTE_READ
    } else {
        AccessFlags::REMOTE_WRITE
    };
    // The registration goes in front of the command, in one chain: only
    // the command is signaled.
    let (ex, reg) = s.qp.expose_wr(pool, LocalBuf::new(buf, 0, len as u32)?, access)?;
    let r = ex.remote();
    let mut cmd = Vec::with_capacity(CMD as usize);
    cmd.extend_from_slice(&u32::from(write).to_le_bytes());
    cmd.extend_from_slice(&(tag as u32).to_le_bytes());
    cmd.extend_from_slice(&(off as u64).to_le_bytes());
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    cmd.extend_from_slice(&r.rkey.to_le_bytes());
    cmd.extend_from_slice(&r.addr.to_le_bytes());
    s.qp.post(vec![reg, UlpWr::send_inline(&cmd)], check)?;
    Ok((Io { write, off, len }, Some(ex)))
}

/// The target's side of one command: move the data, then answer.
fn serve(t: &Side, store: &Arc<Mr>, k: usize) -> Result<()> {
    let cmd = t.msgs.to_vec(k as u64 * u64::from(CMD), CMD as usize)?;
    post_msg_recv(t, k, Ev::Command)?;
    let u32_at = |i: usize| u32::from_le_bytes(cmd[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(cmd[i..i + 8].try_into().unwrap());
    let (write, tag, off, len) = (u32_at(0) == 1, u32_at(4), u64_at(8), u32_at(16));
    let remote = RemoteAddr {
        addr: u64_at(24),
        rkey: u32_at(20),
    };
    let dir = if write { RwDir::Read } else { RwDir::Write };
    let local = LocalBuf::new(store, off, len)?;
    t.qp.rw(
        dir,
        local,
        remote,
        None,
        RwOptions::default(),
        to(move |wc| Ev::Moved(tag, wc.status)),
    )?;
    Ok(())
}

/// RESET->RTS through the layer's `modify`, which records the READ depth
/// set at RTS.
fn connect(qp: &UlpQp, peer: &UlpQp, gid: Gid) -> Result<()> {
    let init = QpModify::new()
        .with_state(QpState::Init)
        .with_pkey_index(0)
        .with_port_num(1);
    let rtr = QpModify::new()
        .with_state(QpState::Rtr)
        .with_path_mtu(Mtu::Mtu4096)
        .with_rq_psn(0);
    let rtr = rtr
        .with_dest_qp_num(peer.qp_num())
        .with_ah_attr(AhAttr::roce(gid, 0, 1));
    let rts = QpModify::new().with_state(QpState::Rts).with_sq_psn(0).with_timeout(14);
    let rts = rts.with_retry_cnt(7).with_rnr_retry(7).with_max_rd_atomic(16);
    for m in [
        init.with_access_flags(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
        rtr.with_max_dest_rd_atomic(16).with_min_rnr_timer(1),
        rts,
    ] {
        qp.modify(&m.attr, m.mask)?;
    }
    Ok(())
}
