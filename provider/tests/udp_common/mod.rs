//! Helpers shared by the UDP link tests: devices on loopback, one RC QP
//! per side with a registered buffer, and patient completion waits.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::{UdpConfig, UdpPort};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;

/// Generous bound for anything that must happen (never reached unless
/// something is broken, so a loaded machine does not flake).
pub const WAIT: Duration = Duration::from_secs(20);

pub const LO4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const LO6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// Sets an integer socket option on `fd` (a socket the test owns or the
/// link's, alive), asserting that the kernel took it.
pub fn set_int_sockopt(fd: std::os::fd::RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: `fd` is an open socket; the option points at a live c_int of
    // the size given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(r, 0, "setsockopt({level}, {name}, {value})");
}

/// A unique device name (tests of one binary share the device list).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A UDP device on `ip` with a private automatic port (never 4791, so
/// tests do not race for it).
pub fn device(ip: IpAddr, mode: EngineMode) -> Arc<SoftDevice> {
    let mut udp = UdpConfig::new(ip);
    udp.port = UdpPort::Fixed(free_private_port(ip));
    let mut cfg = SoftDeviceConfig::udp(&unique("udp"), udp).expect("bind");
    cfg.engine = mode;
    SoftDevice::create(cfg).expect("create device")
}

/// A private port free on `ip` right now.
pub fn free_private_port(ip: IpAddr) -> u16 {
    loop {
        let s = std::net::UdpSocket::bind((ip, 0)).expect("bind ephemeral");
        let p = s.local_addr().unwrap().port();
        if (0x8000..0xc000).contains(&p) {
            return p;
        }
    }
}

pub struct Side {
    pub dev: Arc<SoftDevice>,
    pub ctx: Context,
    pub pd: Pd,
    pub scq: Cq,
    pub rcq: Cq,
    pub qp: Qp,
    pub mr: Mr,
    pub gid: Gid,
    pub psn: u32,
}

pub fn side(dev: &Arc<SoftDevice>, mr_len: usize, psn: u32) -> Side {
    let ctx = dev.open().expect("open");
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(1024, 1, None, 0).unwrap();
    let rcq = ctx.create_cq(1024, 2, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let mr = pd
        .alloc_mr(
            mr_len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    Side {
        dev: dev.clone(),
        ctx,
        pd,
        scq,
        rcq,
        qp,
        mr,
        gid,
        psn,
    }
}

/// Moves `s` to RTS towards QP `dest_qpn` at `dgid` whose first PSN is
/// `rq_psn`.
pub fn connect_to(s: &Side, dgid: Gid, dest_qpn: u32, rq_psn: u32, mtu: Mtu) {
    connect_to_timeout(s, dgid, dest_qpn, rq_psn, mtu, 14);
}

/// [`connect_to`] with the local ACK timeout `timeout` (4.096 µs ·
/// 2^timeout).
pub fn connect_to_timeout(s: &Side, dgid: Gid, dest_qpn: u32, rq_psn: u32, mtu: Mtu, timeout: u8) {
    let local = Endpoint::local(&s.ctx, &s.qp, 1, 0).unwrap().with_psn(s.psn);
    let remote = Endpoint {
        qpn: dest_qpn,
        psn: rq_psn,
        gid: dgid,
        mtu,
        ..local
    };
    Connect::new()
        .access(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        .mtu(mtu)
        .timeout(timeout)
        .min_rnr_timer(1)
        .apply(&s.ctx, &s.qp, &local, Some(&remote))
        .unwrap();
}

/// Connects two sides to each other.
pub fn connect(a: &Side, b: &Side, mtu: Mtu) {
    connect_to(a, b.gid, b.qp.qp_num(), b.psn, mtu);
    connect_to(b, a.gid, a.qp.qp_num(), a.psn, mtu);
}

/// Polls `cq` (and keeps `others` progressing, for inline devices polled
/// from one thread) until one completion arrives.
pub fn wait_one(cq: &Cq, others: &[&Cq]) -> WorkCompletion {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default()];
    let mut scratch = [WorkCompletion::default(); 4];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        for o in others {
            // Polling drives an inline device; completions there are not
            // expected by callers that pass it here.
            let _ = o.poll(&mut scratch[..0]);
        }
        assert!(start.elapsed() < WAIT, "no completion within {WAIT:?}");
        std::thread::yield_now();
    }
}

/// Polls `cq` for `dur`, driving `others`; returns what arrived.
pub fn collect(cq: &Cq, others: &[&Cq], dur: Duration) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    while start.elapsed() < dur {
        let n = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..n]);
        for o in others {
            let _ = o.poll(&mut wc[..0]);
        }
        std::thread::yield_now();
    }
    out
}

/// Repeats `f` until it returns true or [`WAIT`] passes.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An RC SEND_ONLY datagram from `src` to `dst`: a BTH, `payload`, and
/// room for the ICRC (which the link fills in).
pub fn send_only(src: IpAddr, dst: IpAddr, payload: &[u8]) -> softverbs::soft::proto::Transmit {
    let mut data = vec![0u8; 12 + payload.len() + 4];
    data[0] = 0x04; // RC SEND_ONLY
    data[4..8].copy_from_slice(&[0, 0, 0, 0x11]);
    data[12..12 + payload.len()].copy_from_slice(payload);
    softverbs::soft::proto::Transmit {
        src,
        dst,
        src_port: 0xc000,
        dst_port: 0,
        data,
        train: None,
    }
}
