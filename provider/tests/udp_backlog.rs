//! The UDP link's send backlog, exercised for real: a socket whose send
//! buffer fills (`EAGAIN`) keeps what it could not send, in order, and
//! sends it later with valid ICRCs, losing nothing.
//!
//! On loopback the kernel releases a datagram's send-buffer charge at
//! once, so nothing there ever fills a socket. This test sends through a
//! veth pair whose sending end has an HTB qdisc limited to a trickle: the
//! queued datagrams stay charged to the socket (given a small
//! `SO_SNDBUF`), `sendto` and `sendmmsg` return `EAGAIN`, and the link
//! must backlog. The datagrams are read back with a packet socket on the
//! other end of the pair. It needs root, `ip` and `tc`, and the kernel's
//! veth and HTB; it prints a skip line where any is missing.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort};
use softverbs::soft::link::Link;
use softverbs::soft::proto::Transmit;
use softverbs::soft::wire::{check_icrc, IpPseudoHeader, UdpPorts, ROCEV2_UDP_PORT};

/// Datagrams sent by `send_one` (a verb's path), then as many by
/// `send_batch`.
const EACH: u32 = 150;

/// A veth pair, removed when dropped.
struct Veth {
    a: String,
    b: String,
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).status();
    }
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// `10.213.x.1` on end `a` (HTB-limited), neighbour `10.213.x.2` fixed to
/// end `b`'s MAC (nobody answers ARP for it); the reason as an error if
/// this machine cannot.
fn setup(x: u8) -> Result<Veth, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let id = std::process::id() % 100_000;
    let v = Veth {
        a: format!("svbl{id}a"),
        b: format!("svbl{id}b"),
    };
    run(&["ip", "link", "add", &v.a, "type", "veth", "peer", "name", &v.b])?;
    let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", v.b)).map_err(|e| e.to_string())?;
    let ip_a = format!("10.213.{x}.1/24");
    let ip_b = format!("10.213.{x}.2");
    run(&["ip", "link", "set", &v.a, "up"])?;
    run(&["ip", "link", "set", &v.b, "up"])?;
    run(&["ip", "addr", "add", &ip_a, "dev", &v.a])?;
    run(&[
        "ip",
        "neigh",
        "replace",
        &ip_b,
        "lladdr",
        mac.trim(),
        "dev",
        &v.a,
        "nud",
        "permanent",
    ])?;
    run(&[
        "tc", "qdisc", "add", "dev", &v.a, "root", "handle", "1:", "htb", "default", "10",
    ])?;
    run(&[
        "tc", "class", "add", "dev", &v.a, "parent", "1:", "classid", "1:10", "htb", "rate", "400kbit", "burst", "1600",
    ])?;
    Ok(v)
}

/// A packet socket receiving the IPv4 packets that arrive on `ifname`.
fn packet_socket(ifname: &str) -> OwnedFd {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket call; the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
    assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: `name` is a valid C string for the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(ifindex > 0, "no interface {ifname}");
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    fd
}

/// One IPv4 packet from `fd` if one is waiting.
fn read_packet(fd: &OwnedFd) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 2048];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    (n > 0).then(|| {
        buf.truncate(n as usize);
        buf
    })
}

/// An RC SEND_ONLY datagram carrying `seq` in the first 4 of its 8
/// payload bytes.
fn datagram(src: IpAddr, dst: IpAddr, seq: u32) -> Transmit {
    let mut payload = [0u8; 8];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    udp_common::send_only(src, dst, &payload)
}

#[test]
fn a_full_send_buffer_backlogs_in_order_and_loses_nothing() {
    let x = 1 + (std::process::id() % 250) as u8;
    let veth = match setup(x) {
        Ok(v) => v,
        Err(why) => {
            eprintln!(
                "SKIP a_full_send_buffer_backlogs_in_order_and_loses_nothing: needs root, ip, tc, veth and HTB ({why})"
            );
            return;
        }
    };
    let (src, dst) = (
        IpAddr::V4(Ipv4Addr::new(10, 213, x, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 213, x, 2)),
    );
    let capture = packet_socket(&veth.b);
    let mut cfg = UdpConfig::new(src);
    cfg.port = UdpPort::Fixed(ROCEV2_UDP_PORT);
    let link = UdpLink::bind(&cfg).expect("bind on the veth address");
    for fd in link.poll_fds() {
        udp_common::set_int_sockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4096);
    }
    let mut spent = 0usize;
    for seq in 0..EACH {
        link.send_one(datagram(src, dst, seq), &mut |_| spent += 1);
    }
    let mut batch: Vec<Transmit> = (EACH..2 * EACH).map(|seq| datagram(src, dst, seq)).collect();
    link.send_batch(&mut batch, &mut |_| spent += 1);
    let st = link.stats();
    assert!(st.tx_backlogged > 0, "the send buffer never filled: {st:?}");
    // Drain: every flush sends what the socket takes again.
    let ip = IpPseudoHeader::between(src, dst).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 2 * EACH as usize && Instant::now() < deadline {
        link.flush();
        let mut idle = true;
        while let Some(p) = read_packet(&capture) {
            idle = false;
            if p.len() < 20 + 8 + 24 || p[9] != libc::IPPROTO_UDP as u8 {
                continue;
            }
            let (ihl, ip_id, df) = (
                usize::from(p[0] & 0xf) * 4,
                u16::from_be_bytes([p[4], p[5]]),
                p[6] & 0x40 != 0,
            );
            let udp = &p[ihl..];
            let ports = UdpPorts {
                src: u16::from_be_bytes([udp[0], udp[1]]),
                dst: u16::from_be_bytes([udp[2], udp[3]]),
            };
            if ports.dst != ROCEV2_UDP_PORT {
                continue;
            }
            let roce = &udp[8..];
            assert_eq!((ip_id, df), (0, true), "the ICRC is computed for id 0 and DF");
            let seq = u32::from_be_bytes(roce[12..16].try_into().unwrap());
            assert!(check_icrc(&ip, ports, roce), "datagram {seq}: bad ICRC");
            got.push(seq);
        }
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let st = link.stats();
    assert_eq!(got, (0..2 * EACH).collect::<Vec<_>>(), "in order, each once: {st:?}");
    assert_eq!(st.tx_backlog_drops, 0, "{st:?}");
    assert_eq!(st.tx_datagrams, u64::from(2 * EACH), "{st:?}");
    assert_eq!(st.tx_errors, 0, "{st:?}");
    drop(veth);
}
