//! The UDP link on loopback: RC send/receive and RDMA WRITE between two
//! soft devices, IPv4 and IPv6, in both engine modes; GIDs and their
//! mapping back to endpoints.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::{addr, Bind, GsoMode, UdpConfig, UdpLink, UdpPort};
use softverbs::verbs::*;
use udp_common::*;

fn send_recv_roundtrip(ip: IpAddr, mode_a: EngineMode, mode_b: EngineMode) {
    let (da, db) = (device(ip, mode_a), device(ip, mode_b));
    let (a, b) = (side(&da, 1 << 16, 100), side(&db, 1 << 16, 9000));
    connect(&a, &b, Mtu::Mtu1024);
    // Several messages, one of them several packets long.
    for (i, len) in [8u32, 1000, 5000, 1].into_iter().enumerate() {
        let i = i as u64;
        let sge = [b.mr.sge(0, 8192).unwrap()];
        b.qp.post_recv(&[RecvWr::new(100 + i, &sge)]).unwrap();
        let payload: Vec<u8> = (0..len).map(|k| (k as u8) ^ (i as u8) ^ 0x5a).collect();
        a.mr.write(0, &payload).unwrap();
        let sge = [a.mr.sge(0, len).unwrap()];
        a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
            .unwrap();
        let r = wait_one(&b.rcq, &[&a.scq]);
        assert_eq!((r.wr_id, r.status, r.byte_len), (100 + i, WcStatus::Success, len));
        assert_eq!(b.mr.to_vec(0, len as usize).unwrap(), payload);
        let s = wait_one(&a.scq, &[&b.rcq]);
        assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
    }
    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
}

#[test]
fn rc_send_recv_ipv4_inline() {
    send_recv_roundtrip(LO4, EngineMode::Inline, EngineMode::Inline);
}

#[test]
fn rc_send_recv_ipv6_inline() {
    send_recv_roundtrip(LO6, EngineMode::Inline, EngineMode::Inline);
}

#[test]
fn rc_send_recv_progress_threads() {
    send_recv_roundtrip(LO4, EngineMode::progress_thread(), EngineMode::progress_thread());
    let sleepy = EngineMode::ProgressThread { spin: Duration::ZERO };
    send_recv_roundtrip(LO6, sleepy, EngineMode::Inline);
}

/// The passive target of RDMA WRITEs never calls a verb: only a progress
/// thread can answer. 1 MiB in 4 KiB packets also exercises GSO batches.
#[test]
fn rdma_write_to_a_passive_target_with_a_progress_thread() {
    let (da, db) = (
        device(LO4, EngineMode::Inline),
        device(LO4, EngineMode::progress_thread()),
    );
    let len = 1 << 20;
    let (a, b) = (side(&da, len, 7), side(&db, len, 77));
    connect(&a, &b, Mtu::Mtu4096);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    a.mr.write(0, &data).unwrap();
    for round in 0..3u64 {
        let sge = [a.mr.sge(0, len as u32).unwrap()];
        a.qp.post_send(
            &[SendWr::new(round, SendOp::Write { remote: b.mr.remote(0) }, &sge).flags(SendFlags::SIGNALED)],
        )
        .unwrap();
        let wc = wait_one(&a.scq, &[]);
        assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
    }
    assert!(b.mr.to_vec(0, len).unwrap() == data, "written data differs");
    let stats = da.shared().link_stats();
    let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap();
    assert!(get("udp_tx_datagrams") >= 3 * 256);
    assert!(get("udp_tx_syscalls") < get("udp_tx_datagrams"), "batched: {stats:?}");
}

/// GRO follows the traffic: off while idle (polls probe with `recvfrom`),
/// on once a stream arrives in batches, off again after a quiet spell; data
/// is intact in every phase, whether a GSO run arrives split or whole.
#[test]
fn gro_switches_with_the_traffic_and_every_byte_arrives() {
    let (da, db) = (device(LO4, EngineMode::Inline), device(LO4, EngineMode::Inline));
    let len = 1 << 20;
    let (a, b) = (side(&da, len, 3), side(&db, len, 33));
    connect(&a, &b, Mtu::Mtu4096);
    let stat = |d: &std::sync::Arc<softverbs::soft::SoftDevice>, n: &str| {
        let s = d.shared().link_stats();
        s.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap()
    };
    let write = |round: u64| {
        let data: Vec<u8> = (0..len).map(|i| (i as u64 * 13 + round) as u8).collect();
        a.mr.write(0, &data).unwrap();
        let sge = [a.mr.sge(0, len as u32).unwrap()];
        a.qp.post_send(
            &[SendWr::new(round, SendOp::Write { remote: b.mr.remote(0) }, &sge).flags(SendFlags::SIGNALED)],
        )
        .unwrap();
        // Polling B's CQ drives B (inline).
        let wc = wait_one(&a.scq, &[&b.rcq]);
        assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
        assert!(
            b.mr.to_vec(0, len).unwrap() == data,
            "round {round}: written data differs"
        );
    };
    write(0);
    assert!(stat(&db, "udp_rx_gro_switches") >= 1, "a stream turns GRO on");
    write(1);
    // A quiet spell of polls turns it off again (an even count: off).
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..20_000 {
        let _ = b.rcq.poll(&mut wc[..0]);
        if stat(&db, "udp_rx_gro_switches") % 2 == 0 {
            break;
        }
    }
    assert_eq!(stat(&db, "udp_rx_gro_switches") % 2, 0, "quiet: GRO off");
    // Small messages now arrive through the probe, and a stream again.
    let sge = [b.mr.sge(0, 64).unwrap()];
    b.qp.post_recv(&[RecvWr::new(9, &sge)]).unwrap();
    let sge = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::new(8, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 8));
    assert_eq!(wait_one(&a.scq, &[&b.rcq]).status, WcStatus::Success);
    write(2);
    assert_eq!(stat(&db, "udp_rx_bad_icrc"), 0);
    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
}

/// One `drive()` reads the link dry: an application with an
/// edge-triggered poller calls it once per readiness event, and an idle
/// link's first read takes one datagram.
#[test]
fn one_drive_reads_every_waiting_datagram() {
    let (da, db) = (device(LO4, EngineMode::Inline), device(LO4, EngineMode::Inline));
    let (a, b) = (side(&da, 1 << 16, 5), side(&db, 1 << 16, 55));
    connect(&a, &b, Mtu::Mtu1024);
    let rx = || {
        let s = db.shared().link_stats();
        s.iter()
            .find(|(k, _)| *k == "udp_rx_datagrams")
            .map(|(_, v)| *v)
            .unwrap()
    };
    for i in 0..5u64 {
        let sge = [b.mr.sge(64 * i, 64).unwrap()];
        b.qp.post_recv(&[RecvWr::new(i, &sge)]).unwrap();
    }
    let before = rx();
    for i in 0..5u64 {
        let sge = [a.mr.sge(0, 8).unwrap()];
        a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge)]).unwrap();
    }
    // Posting on an inline device sends at once; let the datagrams land.
    std::thread::sleep(Duration::from_millis(50));
    db.shared().drive();
    assert_eq!(rx() - before, 5, "one drive read all five");
    let got = collect(&b.rcq, &[], Duration::from_millis(20));
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn rdma_read_ipv6() {
    let (da, db) = (
        device(LO6, EngineMode::Inline),
        device(LO6, EngineMode::progress_thread()),
    );
    let len = 200_000;
    let (a, b) = (side(&da, len, 1), side(&db, len, 2));
    connect(&a, &b, Mtu::Mtu4096);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    b.mr.write(0, &data).unwrap();
    let sge = [a.mr.sge(0, len as u32).unwrap()];
    a.qp.post_send(&[SendWr::new(5, SendOp::Read { remote: b.mr.remote(0) }, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = wait_one(&a.scq, &[]);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    assert!(a.mr.to_vec(0, len).unwrap() == data);
}

#[test]
fn gids_encode_address_and_port() {
    let d = device(LO4, EngineMode::Inline);
    let gid = d.gids()[0];
    assert!(addr::is_private(gid), "{gid}");
    let ctx = d.open().unwrap();
    assert_eq!(ctx.query_gid(1, 0).unwrap(), gid);
    let ep = addr::endpoint_of(gid, None).unwrap();
    assert_eq!(ep.ip(), LO4);
    assert!((0x8000..0xc000).contains(&ep.port()));
    // The string form is the documented one.
    let s = gid.to_string();
    assert!(s.starts_with("fd73:7665:7262:0004:0000:"), "{s}");
    assert!(s.ends_with(":7f00:0001"), "{s}");
}

#[test]
fn the_standard_port_gives_the_standard_gid() {
    let cfg = UdpConfig {
        port: UdpPort::Standard,
        ..UdpConfig::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)))
    };
    match UdpLink::bind(&cfg) {
        Ok(link) => {
            assert_eq!(link.gids(), vec![Gid::from_ip(LO4)]);
            assert_eq!(link.local_addrs(), vec![SocketAddr::new(LO4, 4791)]);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            eprintln!("SKIP the_standard_port_gives_the_standard_gid: 127.0.0.1:4791 is in use");
        }
        Err(e) => panic!("bind: {e}"),
    }
}

#[test]
fn binding_an_interface_takes_all_its_addresses() {
    let cfg = UdpConfig {
        port: UdpPort::Fixed(free_private_port(LO4)),
        ..UdpConfig::interface("lo")
    };
    let link = match UdpLink::bind(&cfg) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return, // lost a port race: nothing to check
        Err(e) => panic!("bind lo: {e}"),
    };
    let addrs = link.local_addrs();
    assert!(addrs.iter().any(|a| a.ip() == LO4), "{addrs:?}");
    assert_eq!(link.gids().len(), addrs.len());
    assert!(UdpLink::bind(&UdpConfig::interface("no-such-if0")).is_err());
    assert!(UdpLink::bind(&UdpConfig {
        bind: Bind::Addr(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        ..UdpConfig::new(LO4)
    })
    .is_err());
}

/// Two QPs on each device, used at once: datagrams reach the right QP.
#[test]
fn several_qps_share_a_device() {
    let (da, db) = (device(LO4, EngineMode::Inline), device(LO4, EngineMode::Inline));
    let a1 = side(&da, 4096, 10);
    let a2 = side(&da, 4096, 20);
    let b1 = side(&db, 4096, 30);
    let b2 = side(&db, 4096, 40);
    connect(&a1, &b1, Mtu::Mtu1024);
    connect(&a2, &b2, Mtu::Mtu1024);
    for (tx, rx, byte) in [(&a1, &b1, 1u8), (&a2, &b2, 2u8), (&b1, &a1, 3u8)] {
        let sge = [rx.mr.sge(0, 64).unwrap()];
        rx.qp.post_recv(&[RecvWr::new(byte.into(), &sge)]).unwrap();
        tx.mr.fill(0, 64, byte).unwrap();
        let sge = [tx.mr.sge(0, 64).unwrap()];
        tx.qp.post_send(&[SendWr::new(0, SendOp::Send, &sge)]).unwrap();
        let wc = wait_one(&rx.rcq, &[&tx.scq]);
        assert_eq!((wc.wr_id, wc.status), (u64::from(byte), WcStatus::Success));
        assert_eq!(rx.mr.to_vec(0, 64).unwrap(), vec![byte; 64]);
    }
}

/// The buffers of datagrams the link sent come back to the caller (the
/// engine builds its next packets in them): the very same allocations, and
/// the datagrams still arrive intact; with GSO (one message for the three)
/// and without (`sendmmsg` of three).
#[test]
fn sent_buffers_come_back_for_reuse() {
    sent_buffers_come_back(GsoMode::Auto);
    sent_buffers_come_back(GsoMode::Off);
}

/// A UDP link on 127.0.0.1 at a private port.
fn bind_lo4(gso: GsoMode) -> std::sync::Arc<UdpLink> {
    let mut cfg = UdpConfig::new(LO4);
    cfg.port = UdpPort::Fixed(free_private_port(LO4));
    cfg.gso = gso;
    UdpLink::bind(&cfg).expect("bind")
}

fn sent_buffers_come_back(gso: GsoMode) {
    use softverbs::soft::link::Link;
    use softverbs::soft::proto::Transmit;
    let (a, b) = (bind_lo4(gso), bind_lo4(gso));
    if gso == GsoMode::Off {
        assert!(!a.gso_active());
    } else if !a.gso_active() {
        eprintln!("skip: this kernel has no UDP GSO; the GSO case ran as plain sendmmsg");
    }
    let (src, dst) = (a.gids()[0].to_ip(), b.gids()[0].to_ip());
    let mut txs: Vec<Transmit> = (0..3u8).map(|i| send_only(src, dst, &[i; 100])).collect();
    let sent: Vec<*const u8> = txs.iter().map(|t| t.data.as_ptr()).collect();
    let mut spent = Vec::new();
    a.send_batch(&mut txs, &mut |buf| spent.push(buf));
    assert!(txs.is_empty());
    let back: Vec<*const u8> = spent.iter().map(|b| b.as_ptr()).collect();
    assert_eq!(back, sent, "each sent buffer comes back once, in order");
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while got.len() < 3 && std::time::Instant::now() < deadline {
        b.recv(64, &mut |d| got.push(d.data[12..112].to_vec()));
    }
    assert_eq!(got, (0..3u8).map(|i| vec![i; 100]).collect::<Vec<_>>());
    let st = a.stats();
    assert_eq!(st.tx_datagrams, 3);
    assert_eq!(st.tx_gso_messages > 0, a.gso_active(), "{gso:?}: {st:?}");
}

/// `send_one` (a verb's single datagram) is one `sendto`: the datagram
/// arrives with a valid ICRC (the receiving link drops it otherwise), its
/// buffer comes back for reuse, and a destination no socket can reach is
/// counted, not sent.
#[test]
fn send_one_is_one_system_call() {
    use softverbs::soft::link::Link;
    let (a, b) = (bind_lo4(GsoMode::Auto), bind_lo4(GsoMode::Auto));
    let (src, dst) = (a.gids()[0].to_ip(), b.gids()[0].to_ip());
    let t = send_only(src, dst, b"8 bytes!");
    let sent = t.data.as_ptr();
    let mut spent = Vec::new();
    a.send_one(t, &mut |buf| spent.push(buf));
    assert_eq!(spent.iter().map(|b| b.as_ptr()).collect::<Vec<_>>(), [sent]);
    let st = a.stats();
    assert_eq!((st.tx_datagrams, st.tx_syscalls), (1, 1), "{st:?}");
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while got.is_empty() && std::time::Instant::now() < deadline {
        b.recv(64, &mut |d| got.push(d.data[12..20].to_vec()));
    }
    assert_eq!(got, [b"8 bytes!".to_vec()]);
    assert_eq!(b.stats().rx_bad_icrc, 0);
    // An IPv6 destination: this IPv4-only link has no socket for it.
    a.send_one(
        send_only(src, IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), &[0; 8]),
        &mut |buf| spent.push(buf),
    );
    let st = a.stats();
    assert_eq!((st.tx_unroutable, st.tx_datagrams, spent.len()), (1, 1, 1), "{st:?}");
}

/// The send side remembers its last destination (a ping-pong sends every
/// packet the same way): alternating destinations still reach each its
/// own peer, with a valid ICRC for each.
#[test]
fn alternating_destinations_reach_their_peers() {
    use softverbs::soft::link::Link;
    let (a, b, c) = (
        bind_lo4(GsoMode::Auto),
        bind_lo4(GsoMode::Auto),
        bind_lo4(GsoMode::Auto),
    );
    let src = a.gids()[0].to_ip();
    let to = [
        b.gids()[0].to_ip(),
        c.gids()[0].to_ip(),
        b.gids()[0].to_ip(),
        c.gids()[0].to_ip(),
    ];
    for (i, dst) in to.into_iter().enumerate() {
        a.send_one(send_only(src, dst, &[i as u8, 0, 0, 0]), &mut drop);
    }
    let got = |l: &UdpLink| {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + WAIT;
        while got.len() < 2 && std::time::Instant::now() < deadline {
            l.recv(64, &mut |d| got.push(d.data[12]));
        }
        got
    };
    assert_eq!(got(&b), [0, 2]);
    assert_eq!(got(&c), [1, 3]);
    assert_eq!(b.stats().rx_bad_icrc + c.stats().rx_bad_icrc, 0);
}
