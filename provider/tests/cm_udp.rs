//! The connection manager between soft devices on the UDP link (loopback,
//! the standard RoCEv2 port 4791 on two loopback addresses, so the GIDs
//! are the standard ones): connect, data, disconnect with inline engines
//! (the CM's agent reads their links) and with progress threads; and, when
//! tshark is installed, a capture of the handshake decodes as InfiniBand
//! CM in RoCEv2.

mod cm_common;

use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cm_common::*;
use softverbs::cm::*;
use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::{UdpConfig, UdpPort};
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::{AccessFlags, RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

/// A subsystem with UDP devices at 127.`net`.0.1 and .2 on port 4791;
/// `None` (after a SKIP line) if the port is taken there.
fn udp_world(net: u8, mode: EngineMode) -> Option<(Arc<Subsystem>, Cm)> {
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    for host in 1..=2u8 {
        let ip: IpAddr = format!("127.{net}.0.{host}").parse().unwrap();
        let mut udp = UdpConfig::new(ip);
        udp.port = UdpPort::Standard;
        let Ok(mut cfg) = SoftDeviceConfig::udp(&unique("cmudp"), udp) else {
            println!("SKIP: {ip}:4791 is taken");
            return None;
        };
        cfg.engine = mode;
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).expect("add");
    }
    let cm = Cm::new(sub.clone(), fast_config()).unwrap();
    Some((sub, cm))
}

fn lo(net: u8, host: u8) -> IpAddr {
    format!("127.{net}.0.{host}").parse().unwrap()
}

fn poll_one(cq: &softverbs::verbs::Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default()];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        assert!(std::time::Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    }
}

/// Connect, one SEND, disconnect; returns the server's listening port.
fn exchange(cm: &Cm, net: u8, port: u16) {
    let sch = EventChannel::new().unwrap();
    let _l = listener(cm, &sch, PortSpace::Tcp, std::net::SocketAddr::new(lo(net, 2), port));
    let ch = EventChannel::new().unwrap();
    let c = resolved(
        cm,
        &ch,
        PortSpace::Tcp,
        lo(net, 1),
        std::net::SocketAddr::new(lo(net, 2), port),
    );
    let cres = with_qp(&c);
    c.connect(&ConnParam {
        private_data: b"over udp".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..8], b"over udp");
    let s = req.take_id().unwrap();
    let sres = with_qp(&s);
    let smr = sres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp()
        .unwrap()
        .post_recv(&[RecvWr::new(1, &[smr.sge(0, 64).unwrap()])])
        .unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);
    let cmr = cres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"datagram!").unwrap();
    c.qp()
        .unwrap()
        .post_send(&[SendWr::new(2, SendOp::Send, &[cmr.sge(0, 9).unwrap()]).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll_one(&cres.cq).status, WcStatus::Success);
    assert_eq!(poll_one(&sres.cq).status, WcStatus::Success);
    assert_eq!(smr.to_vec(0, 9).unwrap(), b"datagram!");
    c.disconnect().unwrap();
    expect(&ch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
}

#[test]
fn connect_over_udp_with_inline_engines() {
    let Some((_sub, cm)) = udp_world(91, EngineMode::Inline) else {
        return;
    };
    exchange(&cm, 91, 7471);
    exchange(&cm, 91, 7472);
}

#[test]
fn connect_over_udp_with_progress_threads() {
    let Some((_sub, cm)) = udp_world(92, EngineMode::progress_thread()) else {
        return;
    };
    exchange(&cm, 92, 7471);
}

#[test]
fn capture_decodes_as_infiniband_cm() {
    let have = Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !have.is_ok_and(|s| s.success()) {
        println!("SKIP: tshark is not installed");
        return;
    }
    let Some((_sub, cm)) = udp_world(93, EngineMode::Inline) else {
        return;
    };
    let file = std::env::temp_dir().join(format!("cm_capture_{}.pcapng", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let mut cap = match Command::new("tshark")
        .args(["-i", "lo", "-f", "udp port 4791 and host 127.93.0.1", "-w"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: tshark cannot start: {e}");
            return;
        }
    };
    // Wait until the capture runs (tshark says "Capturing on").
    let mut err = cap.stderr.take().unwrap();
    let mut started = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !started.contains("Capturing on") && std::time::Instant::now() < deadline {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut err, &mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        started.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    if !started.contains("Capturing on") {
        let _ = cap.kill();
        println!("SKIP: tshark cannot capture on lo: {started}");
        return;
    }
    // "Capturing on" comes a little before packets are really taken.
    std::thread::sleep(Duration::from_secs(1));
    exchange(&cm, 93, 7471);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: sends SIGINT to our own child, which is alive.
    unsafe {
        libc::kill(cap.id() as i32, libc::SIGINT);
    }
    let _ = cap.wait();
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-T",
            "fields",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "infiniband.mad.mgmtclass",
        ])
        .stderr(Stdio::null())
        .output()
        .expect("tshark -r");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let _ = std::fs::remove_file(&file);
    println!("{text}");
    let attrs: Vec<&str> = text
        .lines()
        .filter(|l| l.split('\t').next().is_some_and(|q| q == "0x000001" || q == "1"))
        .filter_map(|l| l.split('\t').nth(1))
        .collect();
    // REQ, REP, RTU, DREQ, DREP, in the InfiniBand CM's attribute IDs.
    for want in ["0x0010", "0x0013", "0x0014", "0x0015", "0x0016"] {
        assert!(attrs.contains(&want), "attribute {want} not decoded in {text}");
    }
}
