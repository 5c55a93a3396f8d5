//! Connection setup rate, measured on demand (`--ignored`): sequential
//! connect/accept/establish cycles through the CM between two in-process
//! soft devices and between two UDP soft devices on loopback, beside TCP
//! connect/accept on loopback in the same run. Prints connections per
//! second; asserts nothing about speed (the machine is shared).
//!
//! `cargo test -p softverbs --release --test cm_rate -- --ignored --nocapture`

mod cm_common;

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cm_common::*;
use softverbs::cm::*;
use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::{UdpConfig, UdpPort};
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};

const N: usize = 300;

fn cm_rate(cm: &Cm, src: std::net::IpAddr, dst: std::net::SocketAddr) -> f64 {
    let sch = EventChannel::new().unwrap();
    let _l = listener(cm, &sch, PortSpace::Tcp, dst);
    let start = Instant::now();
    for _ in 0..N {
        let ch = EventChannel::new().unwrap();
        let c = resolved(cm, &ch, PortSpace::Tcp, src, dst);
        let _cr = with_qp(&c);
        c.connect(&ConnParam::default()).unwrap();
        let mut req = expect(&sch, CmEventKind::ConnectRequest);
        let s = req.take_id().unwrap();
        let _sr = with_qp(&s);
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, CmEventKind::Established);
        expect(&sch, CmEventKind::Established);
    }
    N as f64 / start.elapsed().as_secs_f64()
}

fn tcp_rate() -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for _ in 0..N {
            let _ = l.accept().unwrap();
        }
    });
    let start = Instant::now();
    for _ in 0..N {
        let _ = TcpStream::connect(addr).unwrap();
    }
    t.join().unwrap();
    N as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn setup_rate() {
    let cfg = || CmConfig {
        timewait: Duration::from_millis(50),
        ..CmConfig::default()
    };
    let w = world(141, 2, cfg());
    let inproc = cm_rate(&w.cm, ip(141, 1), sa(141, 2, 7000));
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let mut udp_ok = true;
    for host in 1..=2u8 {
        let mut u = UdpConfig::new(format!("127.142.0.{host}").parse().unwrap());
        u.port = UdpPort::Standard;
        match SoftDeviceConfig::udp(&unique("rate"), u) {
            Ok(mut c) => {
                c.engine = EngineMode::Inline;
                sub.add_device(SoftFactory::new(c), NamespaceId::INIT).unwrap();
            }
            Err(_) => udp_ok = false,
        }
    }
    let udp = if udp_ok {
        let cm = Cm::new(sub.clone(), cfg()).unwrap();
        Some(cm_rate(
            &cm,
            "127.142.0.1".parse().unwrap(),
            "127.142.0.2:7000".parse().unwrap(),
        ))
    } else {
        None
    };
    let tcp = tcp_rate();
    println!("connections/s, {N} sequential: cm in-process {inproc:.0}, cm udp {udp:?}, tcp loopback {tcp:.0}");
}
