//! The UDP link's connected twins (see "Connected sockets" in the
//! `softverbs::soft::link::udp` docs): single datagrams to the destination
//! a device keeps sending to leave by a connected socket; the peer's
//! datagrams, and everybody else's, still arrive, in order and with a
//! valid ICRC; no third socket can join the port; a peer's death is no
//! error.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort, CONNECT_AFTER, QUIET_EVERY};
use softverbs::soft::link::Link;
use udp_common::*;

fn bind_lo(ip: IpAddr, connect: bool) -> Arc<UdpLink> {
    let mut cfg = UdpConfig::new(ip);
    cfg.port = UdpPort::Fixed(free_private_port(ip));
    cfg.connect = connect;
    UdpLink::bind(&cfg).expect("bind")
}

fn ip_of(l: &UdpLink) -> IpAddr {
    l.gids()[0].to_ip()
}

/// Sends `n` single datagrams from `a` to `b`, numbered from `first`.
fn send_n(a: &UdpLink, b: &UdpLink, first: u32, n: u32) {
    for seq in first..first + n {
        a.send_one(send_only(ip_of(a), ip_of(b), &seq.to_be_bytes()), &mut drop);
    }
}

/// Receives `n` datagrams on `l`: (source as the engine sees it, number).
fn recv_n(l: &UdpLink, n: usize) -> Vec<(IpAddr, u32)> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while got.len() < n && std::time::Instant::now() < deadline {
        l.recv(64, &mut |d| {
            got.push((d.src, u32::from_be_bytes(d.data[12..16].try_into().unwrap())));
        });
    }
    got
}

fn from(l: &UdpLink, seqs: std::ops::Range<u32>) -> Vec<(IpAddr, u32)> {
    seqs.map(|s| (ip_of(l), s)).collect()
}

fn twin_ping_pong(ip: IpAddr) {
    let (a, b, c) = (bind_lo(ip, true), bind_lo(ip, true), bind_lo(ip, true));
    let n = CONNECT_AFTER;
    // Below the streak everything goes by the bound socket.
    send_n(&a, &b, 0, n - 1);
    assert_eq!(a.stats().tx_connected, 0, "{:?}", a.stats());
    assert_eq!(recv_n(&b, (n - 1) as usize), from(&a, 0..n - 1));
    // Then the twin connects and carries the rest.
    send_n(&a, &b, n - 1, n + 1);
    let st = a.stats();
    assert_eq!((st.tx_connects, st.tx_connected), (1, u64::from(n) + 1), "{st:?}");
    assert_eq!(recv_n(&b, (n + 1) as usize), from(&a, n - 1..2 * n));
    // The answers: b's twin connects to a, whose twin (connected to b)
    // receives them; c's datagrams to a come by a's bound socket.
    for round in 0..2 * n {
        send_n(&b, &a, 1000 + round, 1);
        send_n(&c, &a, 2000 + round, 1);
    }
    let got = recv_n(&a, 4 * n as usize);
    let by = |l: &UdpLink| {
        got.iter()
            .filter(|(s, _)| *s == ip_of(l))
            .map(|p| p.1)
            .collect::<Vec<_>>()
    };
    assert_eq!(by(&b), (1000..1000 + 2 * n).collect::<Vec<_>>(), "b's, in order");
    assert_eq!(by(&c), (2000..2000 + 2 * n).collect::<Vec<_>>(), "c's, in order");
    assert_eq!(got.len(), 4 * n as usize);
    assert_eq!(b.stats().tx_connects, 1, "{:?}", b.stats());
    assert_eq!(c.stats().tx_connects, 1, "{:?}", c.stats());
    for l in [&a, &b, &c] {
        let st = l.stats();
        assert_eq!((st.rx_bad_icrc, st.rx_errors, st.tx_errors), (0, 0, 0), "{st:?}");
    }
}

#[test]
fn a_ping_pong_moves_to_connected_sockets_ipv4() {
    twin_ping_pong(LO4);
}

#[test]
fn a_ping_pong_moves_to_connected_sockets_ipv6() {
    twin_ping_pong(LO6);
}

/// The twin follows the destination a device keeps sending to; every
/// datagram arrives, in order, wherever it went.
#[test]
fn the_twin_follows_the_destination() {
    let (a, b, c) = (bind_lo(LO4, true), bind_lo(LO4, true), bind_lo(LO4, true));
    let n = 2 * CONNECT_AFTER;
    send_n(&a, &b, 0, n);
    send_n(&a, &c, 0, n);
    send_n(&a, &b, n, n);
    assert_eq!(a.stats().tx_connects, 3, "{:?}", a.stats());
    assert_eq!(recv_n(&b, 2 * n as usize), from(&a, 0..2 * n));
    assert_eq!(recv_n(&c, n as usize), from(&a, 0..n));
    // Alternating destinations never build a streak: the twin stays.
    for seq in 0..n {
        send_n(&a, &c, n + seq, 1);
        send_n(&a, &b, 2 * n + seq, 1);
    }
    assert_eq!(a.stats().tx_connects, 3, "{:?}", a.stats());
    assert_eq!(recv_n(&c, n as usize), from(&a, n..2 * n));
    assert_eq!(recv_n(&b, n as usize), from(&a, 2 * n..3 * n));
}

/// Off in the configuration: no twin, every datagram by the bound socket
/// (and the link watches one descriptor per address).
#[test]
fn twins_can_be_turned_off() {
    let (a, b) = (bind_lo(LO4, false), bind_lo(LO4, false));
    assert_eq!(a.poll_fds().len(), 1);
    send_n(&a, &b, 0, 3 * CONNECT_AFTER);
    assert_eq!(recv_n(&b, 3 * CONNECT_AFTER as usize), from(&a, 0..3 * CONNECT_AFTER));
    let st = a.stats();
    assert_eq!((st.tx_connects, st.tx_connected), (0, 0), "{st:?}");
    assert_eq!(bind_lo(LO4, true).poll_fds().len(), 2, "a twin beside the bound socket");
}

/// The port stays the device's alone: a socket that asks to share it
/// (`SO_REUSEPORT`) is refused, as is a plain bind.
#[test]
fn no_third_socket_joins_the_port() {
    let a = bind_lo(LO4, true);
    let local = a.local_addrs()[0];
    assert!(std::net::UdpSocket::bind(local).is_err());
    // SAFETY: a plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    assert!(fd >= 0);
    set_int_sockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1);
    // SAFETY: `fd` is this test's socket; the address points at a live
    // sockaddr_in of the size given.
    let bound = unsafe {
        let SocketAddr::V4(v4) = local else { unreachable!() };
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        libc::bind(
            fd,
            std::ptr::addr_of!(sin).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    // SAFETY: `fd` is this test's and closed once.
    unsafe { libc::close(fd) };
    assert_ne!(bound, 0, "a SO_REUSEPORT socket joined the device's port");
    // And the device still receives what is sent to it.
    let b = bind_lo(LO4, true);
    send_n(&b, &a, 0, 2 * CONNECT_AFTER);
    assert_eq!(recv_n(&a, 2 * CONNECT_AFTER as usize), from(&b, 0..2 * CONNECT_AFTER));
}

/// A peer that goes away: its ICMP port unreachable reaches the connected
/// twin, which neither fails a send nor counts a receive error.
#[test]
fn a_vanished_peer_is_no_error() {
    let (a, b) = (bind_lo(LO4, true), bind_lo(LO4, true));
    let dst = ip_of(&b);
    send_n(&a, &b, 0, 2 * CONNECT_AFTER);
    assert_eq!(recv_n(&b, 2 * CONNECT_AFTER as usize).len(), 2 * CONNECT_AFTER as usize);
    drop(b);
    for seq in 0..8u32 {
        a.send_one(send_only(ip_of(&a), dst, &seq.to_be_bytes()), &mut drop);
        a.recv(64, &mut |_| panic!("nothing to receive"));
    }
    let st = a.stats();
    assert_eq!((st.tx_errors, st.rx_errors), (0, 0), "{st:?}");
    assert_eq!(st.tx_datagrams, 2 * u64::from(CONNECT_AFTER) + 8, "{st:?}");
}

/// Towards a standard-GID IPv4 peer that is not on loopback (possibly rxe
/// or a NIC, which check the ICRC against the real IP identification) the
/// twin never connects.
#[test]
fn no_twin_towards_a_standard_ipv4_gid_elsewhere() {
    let a = bind_lo(LO4, true);
    let far = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    for seq in 0..3 * CONNECT_AFTER {
        a.send_one(send_only(ip_of(&a), far, &seq.to_be_bytes()), &mut drop);
    }
    let st = a.stats();
    assert_eq!((st.tx_connects, st.tx_connected), (0, 0), "{st:?}");
}

/// Two inline devices in an RC ping-pong of 8-byte sends (perftest's
/// `send_lat`: unsignaled but every 16th): both move to their twins, and
/// every message arrives, in order, with nothing dropped.
#[test]
fn an_rc_ping_pong_rides_the_twins() {
    use softverbs::soft::engine::EngineMode;
    use softverbs::verbs::*;
    let (da, db) = (device(LO4, EngineMode::Inline), device(LO4, EngineMode::Inline));
    let (a, b) = (side(&da, 4096, 7), side(&db, 4096, 77));
    connect(&a, &b, Mtu::Mtu1024);
    let stat = |d: &Arc<softverbs::soft::SoftDevice>, n: &str| {
        let s = d.shared().link_stats();
        s.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap()
    };
    let rounds = 4 * u64::from(CONNECT_AFTER);
    for (s, off) in [(&a, 0), (&b, 0)] {
        let sge = [s.mr.sge(off, 64).unwrap()];
        s.qp.post_recv(&[RecvWr::new(0, &sge)]).unwrap();
    }
    for i in 1..=rounds {
        for (tx, rx) in [(&a, &b), (&b, &a)] {
            tx.mr.write(1024, &i.to_le_bytes()).unwrap();
            let sge = [tx.mr.sge(1024, 8).unwrap()];
            let flags = if i % 16 == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            tx.qp
                .post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(flags)])
                .unwrap();
            let wc = wait_one(&rx.rcq, &[]);
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8), "round {i}");
            assert_eq!(rx.mr.to_vec(0, 8).unwrap(), i.to_le_bytes(), "round {i}");
            let sge = [rx.mr.sge(0, 64).unwrap()];
            rx.qp.post_recv(&[RecvWr::new(i, &sge)]).unwrap();
            if flags == SendFlags::SIGNALED {
                assert_eq!(wait_one(&tx.scq, &[&rx.rcq]).status, WcStatus::Success);
            }
        }
    }
    for d in [&da, &db] {
        assert!(stat(d, "udp_tx_connected") > 0, "{:?}", d.shared().link_stats());
        assert_eq!(stat(d, "udp_rx_bad_icrc") + stat(d, "udp_rx_errors"), 0);
        let c = d.shared().counters();
        assert_eq!(c.rx_dropped(), 0, "{c:?}");
    }
}

/// While the twin takes the traffic, idle probes read the quiet bound
/// socket only every [`QUIET_EVERY`]th time: a datagram from another peer
/// still comes within that many probes.
#[test]
fn another_peer_is_heard_beside_a_busy_twin() {
    let (a, b, c) = (bind_lo(LO4, true), bind_lo(LO4, true), bind_lo(LO4, true));
    send_n(&a, &b, 0, CONNECT_AFTER);
    assert_eq!(a.stats().tx_connects, 1);
    let mut calls = 0;
    for round in 0..4u32 {
        // Idle probes: the bound socket goes quiet.
        for _ in 0..1000 {
            a.recv(64, &mut |_| panic!("nothing was sent"));
            calls += 1;
        }
        send_n(&c, &a, round, 1);
        let mut got = Vec::new();
        for _ in 0..QUIET_EVERY {
            a.recv(64, &mut |d| {
                got.push((d.src, u32::from_be_bytes(d.data[12..16].try_into().unwrap())))
            });
            calls += 1;
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!(got, [(ip_of(&c), round)], "round {round}");
    }
    // Every probe reads the twin; the bound socket is read on the 64
    // probes after each datagram it had (and the first 64), then every
    // QUIET_EVERY-th: about 1.12 reads a probe here, 1.29 if it were read
    // every 4th.
    let st = a.stats();
    assert!(st.rx_syscalls < calls * 6 / 5, "{calls} probes: {st:?}");
}

/// A device bound to every address of `lo` has a twin per address: an
/// IPv4 and an IPv6 peer each get their own, and both answer.
#[test]
fn each_address_of_an_interface_has_its_twin() {
    use softverbs::soft::link::udp::Bind;
    let mut cfg = UdpConfig::new(LO4);
    cfg.bind = Bind::Interface("lo".into());
    cfg.port = UdpPort::Fixed(free_private_port(LO4));
    let a = match UdpLink::bind(&cfg) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            eprintln!("SKIP each_address_of_an_interface_has_its_twin: lost a port race ({e})");
            return;
        }
        Err(e) => panic!("bind lo: {e}"),
    };
    // One GID per bound address, in the same order.
    let addrs = a.local_addrs();
    let gid_of = |v6: bool| {
        a.gids()
            .into_iter()
            .zip(&addrs)
            .find(|(_, s)| s.is_ipv6() == v6)
            .map(|p| p.0)
    };
    let (Some(v4), Some(v6)) = (gid_of(false), gid_of(true)) else {
        eprintln!("SKIP each_address_of_an_interface_has_its_twin: lo has no IPv4 and IPv6 address ({addrs:?})");
        return;
    };
    assert_eq!(a.poll_fds().len(), 2 * addrs.len(), "a twin per bound address");
    let (b4, b6) = (bind_lo(LO4, true), bind_lo(LO6, true));
    let n = 2 * CONNECT_AFTER;
    for (peer, src) in [(&b4, v4), (&b6, v6)] {
        for seq in 0..n {
            a.send_one(send_only(src.to_ip(), ip_of(peer), &seq.to_be_bytes()), &mut drop);
        }
        let got: Vec<u32> = recv_n(peer, n as usize).into_iter().map(|p| p.1).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
    }
    let st = a.stats();
    assert_eq!(st.tx_connects, 2, "{st:?}");
    // Both answer, to the twins connected to them: every reply arrives.
    for (peer, base, dst) in [(&b4, 100u32, v4), (&b6, 200u32, v6)] {
        for seq in 0..n {
            peer.send_one(
                send_only(ip_of(peer), dst.to_ip(), &(base + seq).to_be_bytes()),
                &mut drop,
            );
        }
    }
    let mut got: Vec<u32> = recv_n(&a, 2 * n as usize).into_iter().map(|p| p.1).collect();
    got.sort_unstable();
    let want: Vec<u32> = (100..100 + n).chain(200..200 + n).collect();
    assert_eq!(got, want);
    let st = a.stats();
    assert_eq!((st.rx_bad_icrc, st.rx_errors), (0, 0), "{st:?}");
}
