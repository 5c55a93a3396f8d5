//! The block-storage-like target and initiator of `ulp_blockstore.rs`
//! written with raw verbs: the same protocol (per-I/O fast registration
//! of the initiator's buffer, server-driven RDMA READ/WRITE, reply,
//! LOCAL_INV), with the `wr_id` encoding, the REG_MR/LOCAL_INV chains,
//! send-queue sizing and completion dispatch by hand. What it does not do
//! that the layer does: completions of WRs flushed at teardown are not
//! handled (nothing tells which buffer they held), READs are not capped
//! in software, and a failed post leaves a half-built chain behind.
//!
//! `cargo run --release -p softverbs --example ulp_blockstore_raw -- 2000 [--shm] [--size <bytes>]`

use std::sync::Arc;
use std::time::Instant;

use softverbs::soft::link::{shm::ShmMode, udp::UdpConfig};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;

const MAX_IO: usize = 1 << 20;
const QD: usize = 8;
const STORE: usize = QD * MAX_IO;
const CMD: usize = 32;

// wr_id = kind << 32 | slot.
const K_CMD_RECV: u64 = 1;
const K_REPLY_RECV: u64 = 2;
const K_MOVE: u64 = 3;
const K_REPLY: u64 = 4;
const K_REG: u64 = 5;
const K_CMD: u64 = 6;
const K_INV: u64 = 7;

fn id(kind: u64, slot: usize) -> u64 {
    kind << 32 | slot as u64
}

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
    let name = |k| format!("blkraw{}_{pair}_{k}", std::process::id());
    (0..2)
        .map(|k| SoftDevice::create(SoftDeviceConfig::udp_shm(&name(k), UdpConfig::new(lo), ShmMode::Only)?))
        .collect()
}

struct Side {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    msgs: Mr,
}

fn side(ctx: &Context) -> Result<Side> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, 0, None, 0)?;
    // Per slot at most REG_MR + SEND + LOCAL_INV (initiator) or MOVE +
    // REPLY (target) in flight.
    let cap = QpCap {
        max_send_wr: 3 * QD as u32,
        max_recv_wr: QD as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap,
        sq_sig_all: false,
    })?;
    let msgs = pd.alloc_mr(QD * CMD, AccessFlags::LOCAL_WRITE)?;
    Ok(Side { pd, cq, qp, msgs })
}

fn post_recv(s: &Side, kind: u64, k: usize) -> Result<()> {
    let sge = [s.msgs.sge((k * CMD) as u64, CMD as u32)?];
    s.qp.post_recv(&[RecvWr::new(id(kind, k), &sge)]).map_err(|e| e.error)
}

fn send_inline(s: &Side, wr_id: u64, data: &[u8]) -> Result<()> {
    let sge = [Sge::inline(data)];
    let wr = SendWr::new(wr_id, SendOp::Send, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE);
    s.qp.post_send(&[wr]).map_err(|e| e.error)
}

struct Io {
    write: bool,
    off: usize,
    len: usize,
}

/// Runs `ios` I/Os (of `size` bytes, or 4 KiB to 1 MiB at random) between
/// the first two of `devs`; returns (I/Os, bytes, seconds).
pub(crate) fn run(devs: &[Arc<SoftDevice>], ios: usize, size: Option<usize>) -> Result<(usize, u64, f64)> {
    let (cctx, tctx) = (devs[0].open()?, devs[1].open()?);
    let (ini, tgt) = (side(&cctx)?, side(&tctx)?);
    let (ei, et) = (
        Endpoint::local(&cctx, &ini.qp, 1, 0)?,
        Endpoint::local(&tctx, &tgt.qp, 1, 0)?,
    );
    let opts = Connect::new().min_rnr_timer(1);
    opts.apply(&cctx, &ini.qp, &ei, Some(&et))?;
    opts.apply(&tctx, &tgt.qp, &et, Some(&ei))?;
    let store = tgt.pd.alloc_mr(STORE, AccessFlags::LOCAL_WRITE)?;
    for k in 0..QD {
        post_recv(&tgt, K_CMD_RECV, k)?;
        post_recv(&ini, K_REPLY_RECV, k)?;
    }
    let frmrs: Vec<Mr> = (0..QD)
        .map(|_| ini.pd.alloc_fast_reg_mr((MAX_IO / PAGE_SIZE) as u32))
        .collect::<Result<_>>()?;
    let bufs: Vec<Mr> = (0..QD)
        .map(|_| ini.pd.alloc_mr(MAX_IO, AccessFlags::LOCAL_WRITE))
        .collect::<Result<_>>()?;
    let mut model = vec![0u8; STORE];
    let mut slots: Vec<Option<(Io, u32)>> = (0..QD).map(|_| None).collect();
    // Target side: the tag of the command each receive slot is serving.
    let mut serving = [0u32; QD];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let (mut started, mut done, mut bytes) = (0, 0, 0u64);
    let start = Instant::now();
    for k in 0..ios.min(QD) {
        slots[k] = Some(submit(&ini, &frmrs[k], &bufs[k], k, &mut model, &mut rng, size)?);
        started += 1;
    }
    let mut wcs = [WorkCompletion::default(); 32];
    while done < ios {
        let n = tgt.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            let k = (wc.wr_id & 0xffff_ffff) as usize;
            match wc.wr_id >> 32 {
                K_CMD_RECV => {
                    let cmd = tgt.msgs.to_vec((k * CMD) as u64, CMD)?;
                    post_recv(&tgt, K_CMD_RECV, k)?;
                    let u32_at = |i: usize| u32::from_le_bytes(cmd[i..i + 4].try_into().unwrap());
                    let u64_at = |i: usize| u64::from_le_bytes(cmd[i..i + 8].try_into().unwrap());
                    let (write, off, len) = (u32_at(0) == 1, u64_at(8), u32_at(16));
                    serving[k] = u32_at(4);
                    let remote = RemoteAddr {
                        addr: u64_at(24),
                        rkey: u32_at(20),
                    };
                    let op = if write {
                        SendOp::Read { remote }
                    } else {
                        SendOp::Write { remote }
                    };
                    let sge = [store.sge(off, len)?];
                    let wr = SendWr::new(id(K_MOVE, k), op, &sge).flags(SendFlags::SIGNALED);
                    tgt.qp.post_send(&[wr]).map_err(|e| e.error)?;
                }
                K_MOVE => send_inline(&tgt, id(K_REPLY, k), &serving[k].to_le_bytes())?,
                K_REPLY => {}
                other => panic!("unexpected target completion kind {other}"),
            }
        }
        let n = ini.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            let k = (wc.wr_id & 0xffff_ffff) as usize;
            match wc.wr_id >> 32 {
                K_REPLY_RECV => {
                    let tag = u32::from_le_bytes(ini.msgs.to_vec((k * CMD) as u64, 4)?.try_into().unwrap()) as usize;
                    post_recv(&ini, K_REPLY_RECV, k)?;
                    let key = slots[tag].as_ref().expect("I/O in flight").1;
                    let wr = SendWr::new(id(K_INV, tag), SendOp::LocalInv { key }, &[]).flags(SendFlags::SIGNALED);
                    ini.qp.post_send(&[wr]).map_err(|e| e.error)?;
                }
                K_INV => {
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
                        slots[k] = Some(submit(&ini, &frmrs[k], &bufs[k], k, &mut model, &mut rng, size)?);
                        started += 1;
                    }
                }
                K_CMD | K_REG => {}
                other => panic!("unexpected initiator completion kind {other}"),
            }
        }
    }
    Ok((done, bytes, start.elapsed().as_secs_f64()))
}

/// Starts I/O `tag`: data in place, REG_MR of the buffer with a new key,
/// then the command; returns the I/O and the key.
fn submit(
    s: &Side,
    frmr: &Mr,
    buf: &Mr,
    tag: usize,
    model: &mut [u8],
    rng: &mut u64,
    size: Option<usize>,
) -> Result<(Io, u32)> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let len = size.unwrap_or(PAGE_SIZE << (next() % 9));
    let off = tag * MAX_IO + (next() as usize % ((MAX_IO - len) / PAGE_SIZE + 1)) * PAGE_SIZE;
    let write = next() % 2 == 0;
    if write {
        let b = next() as u8;
        let data: Vec<u8> = (0..len).map(|i| b.wrapping_add(i as u8)).collect();
        buf.write(0, &data)?;
        model[off..off + len].copy_from_slice(&data);
    }
    let sgl = [buf.sge(0, len as u32)?];
    if frmr.map_pages(&sgl, PAGE_SIZE as u32)? != 1 {
        return Err(Error::new(
            Verb::MapMrPages,
            ErrorKind::InvalidArgument,
            "short mapping",
        ));
    }
    let key = frmr.next_key();
    let access = AccessFlags::LOCAL_WRITE
        | if write {
            AccessFlags::REMOTE_READ
        } else {
            AccessFlags::REMOTE_WRITE
        };
    let mut cmd = Vec::with_capacity(CMD);
    cmd.extend_from_slice(&u32::from(write).to_le_bytes());
    cmd.extend_from_slice(&(tag as u32).to_le_bytes());
    cmd.extend_from_slice(&(off as u64).to_le_bytes());
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    cmd.extend_from_slice(&key.to_le_bytes());
    cmd.extend_from_slice(&frmr.addr().to_le_bytes());
    let reg = SendWr::new(id(K_REG, tag), SendOp::RegMr { mr: frmr, key, access }, &[]);
    let inline = [Sge::inline(&cmd)];
    let send = SendWr::new(id(K_CMD, tag), SendOp::Send, &inline).flags(SendFlags::SIGNALED | SendFlags::INLINE);
    s.qp.post_send(&[reg, send]).map_err(|e| e.error)?;
    Ok((Io { write, off, len }, key))
}
