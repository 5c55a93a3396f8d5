//! On the wire it is RoCEv2: a capture of `softverbs pingpong` traffic on
//! port 4791 (loopback) decodes in tshark as InfiniBand BTH with RETH and
//! AETH and no malformed packet; every captured packet has IPv4 id 0 and
//! DF set, and an ICRC that matches an independent computation over the
//! captured IP and UDP headers (with GSO and connected sockets off, which
//! between soft devices trade that for speed; see the test's comment). Skips with a line saying why when tshark
//! or dumpcap is missing, capturing is not permitted, or 127.0.0.1:4791 is
//! taken.

mod pingpong_common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pingpong_common::*;

fn skip(why: &str) {
    eprintln!("SKIP pingpong capture test: {why}");
}

/// A dumpcap capture on lo, stopped (SIGINT to its own pid) on drop.
struct Capture {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl Capture {
    fn start() -> Result<Capture, String> {
        let file = std::env::temp_dir().join(format!("softverbs-capture-{}.pcap", std::process::id()));
        let _ = std::fs::remove_file(&file);
        let mut child = Command::new("dumpcap")
            .args(["-i", "lo", "-f", "udp port 4791", "-B", "32", "-P", "-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("dumpcap: {e}"))?;
        // dumpcap says "Capturing on 'Loopback: lo'" once it listens.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.contains("Capturing on") => break,
                Ok(l) => seen.push(l),
                Err(_) => {}
            }
            if let Some(status) = child.try_wait().unwrap() {
                return Err(format!("dumpcap exited ({status}): {}", seen.join(" / ")));
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("dumpcap did not start capturing".into());
            }
        }
        // "Capturing on" is printed as the capture starts, a moment before
        // the kernel filter is attached: packets sent right away can be
        // missed on a loaded machine. Let it settle.
        std::thread::sleep(Duration::from_millis(1000));
        Ok(Capture { child, file })
    }

    fn stop(mut self) -> std::path::PathBuf {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.file.clone()
    }
}

/// Frames of a classic pcap file (Ethernet link type, as Linux captures
/// lo).
fn pcap_frames(bytes: &[u8]) -> Vec<&[u8]> {
    assert!(bytes.len() >= 24, "pcap header");
    assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian microsecond pcap");
    assert_eq!(
        u32::from_le_bytes(bytes[20..24].try_into().unwrap()),
        1,
        "Ethernet link type"
    );
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let orig = u32::from_le_bytes(bytes[at + 12..at + 16].try_into().unwrap()) as usize;
        if at + 16 + incl > bytes.len() {
            break; // a record still being written
        }
        assert_eq!(incl, orig, "a frame was cut by the snap length");
        out.push(&bytes[at + 16..at + 16 + incl]);
        at += 16 + incl;
    }
    out
}

fn crc32_bitwise(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Checks one captured IPv4/UDP/RoCEv2 frame: id 0, DF, and the ICRC over
/// the captured headers with the variant fields masked (RoCEv2 annex).
fn check_frame(i: usize, f: &[u8]) {
    assert_eq!(&f[12..14], &[0x08, 0x00], "frame {i}: IPv4");
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45, "frame {i}: IPv4 without options");
    assert_eq!(&ip[4..6], &[0, 0], "frame {i}: IP identification is 0");
    assert_eq!(ip[6] & 0x40, 0x40, "frame {i}: DF is set");
    assert_eq!(ip[9], 17, "frame {i}: UDP");
    let udp = &f[34..42];
    let payload = &f[42..];
    assert_eq!(
        u16::from_be_bytes([udp[4], udp[5]]) as usize,
        8 + payload.len(),
        "frame {i}: one datagram"
    );
    let mut m = vec![0xffu8; 8];
    let mut iph = ip.to_vec();
    iph[1] = 0xff; // TOS
    iph[8] = 0xff; // TTL
    iph[10] = 0xff; // checksum
    iph[11] = 0xff;
    m.extend_from_slice(&iph);
    let mut udph = udp.to_vec();
    udph[6] = 0xff;
    udph[7] = 0xff;
    m.extend_from_slice(&udph);
    let body = &payload[..payload.len() - 4];
    let mut bth = body[..12].to_vec();
    bth[4] = 0xff;
    m.extend_from_slice(&bth);
    m.extend_from_slice(&body[12..]);
    let icrc = u32::from_le_bytes(payload[payload.len() - 4..].try_into().unwrap());
    assert_eq!(icrc, crc32_bitwise(&m), "frame {i}: ICRC");
}

fn tshark(file: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("tshark");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pingpong_capture_decodes_as_rocev2_with_correct_icrcs() {
    for tool in ["tshark", "dumpcap"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return skip(&format!("{tool} is not installed (apt-get install -y tshark)"));
        }
    }
    if std::net::UdpSocket::bind("127.0.0.1:4791").is_err() {
        return skip("127.0.0.1:4791 is in use");
    }
    let cap = match Capture::start() {
        Ok(c) => c,
        Err(e) => return skip(&format!("cannot capture on lo: {e}")),
    };
    // The server owns 4791 (standard GID), the client a private port.
    // GSO off in every run: the capture point on lo sees GSO messages
    // before they are segmented (see the UDP link docs), and even a
    // ping-pong occasionally batches two equal-length datagrams into one
    // GSO message (udp_tx_gso_messages: ~1 in 200 sends), whose captured
    // form then fails the per-datagram ICRC check. Connected sockets off
    // too: over IPv4 the kernel numbers a connected socket's IP ids, which
    // the ICRC assumes are 0 (see the UDP link docs); the 200 round trips
    // of the first run are enough for the link to connect one otherwise.
    let off = ["--gso", "off", "--connected", "off"];
    let runs: [&[&str]; 3] = [
        &["-s", "100", "-n", "200", "--warmup", "0"],
        &["-s", "3000", "-n", "5", "--warmup", "0", "-m", "1024"],
        &["--op", "write", "-s", "20000", "-n", "4", "-m", "1024"],
    ];
    for args in runs {
        let port = free_tcp_port().to_string();
        let mut server = vec!["-p", port.as_str(), "--bind", "127.0.0.1", "--udp-port", "4791"];
        server.extend_from_slice(args);
        server.extend_from_slice(&off);
        let mut client = vec!["127.0.0.1", "-p", port.as_str()];
        client.extend_from_slice(args);
        client.extend_from_slice(&off);
        run_pair(None, &server, None, &client);
    }
    // The capture reaches the file in blocks that libpcap hands over when
    // full or after a timeout: wait until the file stops growing (and has
    // the last run's packets) before stopping dumpcap.
    let expected = 2 * 200 + 2 * 5 * 3 + 4 * 20;
    let start = Instant::now();
    let (mut last, mut stable_since) = (0, Instant::now());
    while start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        let n = std::fs::read(&cap.file).map_or(0, |b| b.len());
        if n != last {
            (last, stable_since) = (n, Instant::now());
        } else if n > 24 && stable_since.elapsed() > Duration::from_millis(1500) {
            let frames = std::fs::read(&cap.file).map(|b| pcap_frames(&b).len()).unwrap_or(0);
            if frames >= expected {
                break;
            }
        }
    }
    let file = cap.stop();
    let bytes = std::fs::read(&file).expect("the capture file");
    let frames = pcap_frames(&bytes);
    // 200 + 5 ping-pongs (sends, 3-packet sends, ACKs) and 4 writes.
    assert!(frames.len() >= expected, "{} frames", frames.len());
    for (i, f) in frames.iter().enumerate() {
        check_frame(i + 1, f);
    }
    // tshark decodes every frame as InfiniBand (RRoCE), none malformed.
    let total = tshark(&file, &["-T", "fields", "-e", "frame.number"]).lines().count();
    assert_eq!(total, frames.len());
    let not_ib = tshark(
        &file,
        &["-Y", "!infiniband.bth.opcode", "-T", "fields", "-e", "frame.number"],
    );
    assert!(not_ib.trim().is_empty(), "frames not decoded as BTH: {not_ib}");
    let bad = tshark(
        &file,
        &[
            "-Y",
            "_ws.malformed || _ws.expert.severity >= error",
            "-T",
            "fields",
            "-e",
            "frame.number",
        ],
    );
    assert!(bad.trim().is_empty(), "malformed frames: {bad}");
    let opcodes = tshark(&file, &["-T", "fields", "-e", "infiniband.bth.opcode"]);
    let count = |op: &str| opcodes.lines().filter(|l| l.trim() == op).count();
    assert!(count("4") >= 20, "RC SEND Only (4)");
    assert!(count("0") >= 5 && count("2") >= 5, "RC SEND First (0) / Last (2)");
    assert!(count("6") >= 4, "RC RDMA WRITE First (6)");
    assert!(count("17") >= 20, "RC Acknowledge (17)");
    let reth = tshark(
        &file,
        &["-Y", "infiniband.reth.va", "-T", "fields", "-e", "frame.number"],
    );
    assert!(reth.lines().count() >= 4, "RETH decoded");
    let aeth = tshark(
        &file,
        &["-Y", "infiniband.aeth.syndrome", "-T", "fields", "-e", "frame.number"],
    );
    assert!(aeth.lines().count() >= 20, "AETH decoded");
    let _ = std::fs::remove_file(&file);
}
