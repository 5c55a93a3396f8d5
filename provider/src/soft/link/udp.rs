//! The UDP link: RoCEv2 over the kernel's UDP stack, IPv4 and IPv6, so
//! that soft devices in different processes and on different hosts reach
//! each other (and, in principle, rxe or a RoCE NIC).
//!
//! # What goes on the wire
//!
//! Each datagram is one RoCEv2 packet (BTH … ICRC) in a UDP payload, sent
//! from the device's socket to the peer's port (4791 by default). Sockets
//! are unconnected and set `IP_PMTUDISC_DO`: the kernel then sends with DF
//! set and IP identification 0, which is the IPv4 header the ICRC of both
//! ends is computed over (the receiver never sees the real header; the
//! capture test checks that the kernel really sends id 0 and DF). Towards
//! other soft devices and IPv6 peers, a ping-pong's datagrams go by a
//! connected twin (see [Connected sockets](#connected-sockets)).
//!
//! The engine builds packets in its own view of the addresses (the GIDs,
//! and a per-QP entropy source port) and leaves the ICRC to the link
//! ([`Link::needs_icrc`] is false): the link computes it over the real
//! headers on send (the source port on the wire is the socket's) and
//! verifies it against the real headers on receive. Datagrams that are too
//! short, longer than the largest RoCEv2 packet at MTU 4096, or whose ICRC
//! does not match are dropped here and counted ([`UdpStats`]; they also
//! show in the device's [`Counters`] as
//! `rx_malformed` and `rx_bad_icrc`).
//!
//! # Addressing
//!
//! A device binds one UDP socket per address: one address
//! ([`Bind::Addr`]) or every address of an interface ([`Bind::Interface`];
//! IPv6 link-local addresses are skipped). Its GID table has one GID per
//! address, in that order (IPv4 first for an interface):
//!
//! - **Standard GID** when the device owns UDP port 4791 on the address:
//!   `::ffff:a.b.c.d` for IPv4, the address itself for IPv6. This is what
//!   rxe and RoCE NICs use, and peers need nothing else.
//! - **Private GID** when it has another port (several processes on one
//!   host, each with its own port):
//!
//!   ```text
//!   IPv4:  fd73:7665:7262:0004:0000:PPPP:AABB:CCDD   (a.b.c.d, port PPPP)
//!   IPv6:  fd73:7665:7262:0006:PPPP:LLLL:LLLL:LLLL   (low 48 bits L, port P)
//!   ```
//!
//!   `fd73:7665:7262::/48` is a unique local IPv6 prefix (RFC 4193; the
//!   global ID is ASCII "sverb") that no real host should use; the subnet
//!   ID says which form follows. The IPv6 form keeps only the low 48 bits
//!   of the address: the upper 80 are taken from the sending device's own
//!   address, so private-port IPv6 peers must share a /80 (true of `::1`
//!   and of addresses given out from one /80); otherwise use port 4791.
//!
//! The link maps a destination GID back to `(ip, port)` with
//! [`addr::endpoint_of`]. On receive, the source `(ip, port)` becomes the
//! GID the peer announced with [`addr::source_gid`]: port 4791 and the
//! RoCEv2 entropy range 0xC000–0xFFFF (what rxe and NICs send from) give
//! the standard GID, any other port the private form. This is why an
//! automatic private port ([`UdpPort::Auto`]) is taken from 0x8000–0xBFFF.
//!
//! Applications exchange `(GID, QPN, PSN)` out of band exactly as with
//! hardware (`softverbs pingpong` does it over TCP) and put the peer's GID
//! in the QP's address vector; nothing else knows about ports.
//!
//! The source check of a connected QP is only as strong as RoCEv2's:
//! anyone who can send from the peer's address (and, for a private GID,
//! port) can inject packets with a valid ICRC. What such packets can do is
//! bounded by the engine's checks: QPN, PSN window, opcode sequence and
//! the rkey and bounds of every access.
//!
//! # Batching and offloads
//!
//! An idle link polls with `recvfrom` (the cheapest receive call); once
//! data flows it uses `recvmmsg` (a first call for a few buffers, then up
//! to [`RX_BATCH`] per call while they come full; a bounded budget per
//! engine turn), and while a stream flows UDP GRO is on where the kernel
//! has it: a run of equal-size datagrams of one flow (a GSO message from a
//! peer on this host) arrives as one buffer and is split here, so the
//! kernel handles one buffer instead of up to 64 datagrams (see `rx` for
//! when GRO switches). A verb that sends one datagram uses `sendto`; the
//! engine's larger output is grouped into
//! `sendmmsg` calls; runs of equal-length datagrams to one destination (the
//! middle packets of a multi-packet message) go as one UDP GSO message
//! (`UDP_SEGMENT`) when the kernel supports it, with no copy: the segments
//! are an iovec over the packets. If GSO fails once, the link falls back to
//! one datagram per message for good. GSO has one wire-level catch: when
//! the kernel segments a GSO message it numbers the IPv4 ids 0, 1, 2, …,
//! and receivers that check the ICRC against the real header (rxe, NICs)
//! would reject all but the first segment. [`GsoMode::Auto`] therefore
//! uses GSO only towards loopback addresses and private-GID peers (soft
//! devices by construction); [`GsoMode::On`] forces it.
//!
//! When the socket's send buffer is full the rest of a batch waits in a
//! bounded backlog that the next send or receive flushes; beyond it
//! datagrams are dropped and counted (RC retransmits them).
//!
//! # Connected sockets
//!
//! `sendto` on an unconnected socket looks the route up for every
//! datagram; on a connected one the kernel keeps it. In a loopback
//! ping-pong that is ~0.3 µs of a 3 µs one-way trip (C, here; the send
//! call, which delivers into the peer's socket on loopback, measured 2.95
//! against 2.65 µs in `softverbs perf` with probes). So each bound socket
//! has a twin, bound to the same address and port (both set
//! `SO_REUSEPORT` for that bind and clear it right after, so no third
//! socket can join them), that connects to the destination the device
//! keeps sending to: once [`CONNECT_AFTER`] single datagrams in a row went
//! there, the verb path's single datagrams (one `sendto` each, see above)
//! go by `send` on the twin. The batch path keeps `sendmmsg` with
//! addresses on the bound socket: a batch may go to several destinations,
//! and a stream's time goes elsewhere. A twin that has not connected yet
//! is parked, connected to its own address and port, from which only the
//! device itself sends.
//!
//! The peer's datagrams then arrive on the twin (the kernel prefers a
//! connected socket), which the receive path reads first. Each empty
//! receive call costs ~0.3–0.5 µs here, and a datagram that lands while
//! the other socket is read waits for that call; so once the bound socket
//! stayed empty for 64 idle probes, probes read it every
//! [`QUIET_EVERY`]th time only, and a datagram from another peer waits up
//! to `QUIET_EVERY - 1` more probes of the twin (a probe that finds one,
//! and any call that reads batches, reads both). When the twin connects (or moves to
//! another destination), what its peer sent before may still wait on the
//! bound socket and be read after newer datagrams on the twin, once; RC
//! takes that as a loss and resends (a ping-pong has one datagram in
//! flight and never sees it).
//!
//! The catch is GSO's: a connected IPv4 socket numbers the IP
//! identification field, which the ICRC covers. A soft receiver cannot
//! see the real header and puts 0 there, as the sender did, so soft
//! devices agree; rxe and NICs would not. So twins connect only where
//! GSO's `Auto` sends (loopback addresses and private-GID peers, soft
//! devices by construction) and to IPv6 peers (IPv6 has no
//! identification field); [`UdpConfig::connect`] turns them off. A peer's
//! death shows on a connected socket as `ECONNREFUSED` (an ICMP port
//! unreachable) on the next call: a send that reports it sent nothing and
//! is made again, and a receive that reports it is no error.
//!
//! # Injected loss (tests and benchmarks)
//!
//! [`UdpConfig::drop`] makes the link discard a seeded random share of
//! its outgoing datagrams before they reach the socket, each with the
//! same probability, independently (counted as `udp_tx_injected_drops`).
//! It stands in for a lossy network where none can be made (no `netem`
//! in the kernel, no root): RC recovery then runs over real sockets and
//! processes. The choice is made once per datagram when it is routed, so
//! a retransmission is a new draw; the sequence of draws follows from the
//! seed alone, but which packet meets which draw depends on timing. Off
//! (`None`, the default) it costs one test of an `Option` per datagram.
//! `softverbs perf --drop P` sets it for the devices a run creates.
//!
//! # Examples
//!
//! ```no_run
//! use std::net::{IpAddr, Ipv4Addr};
//! use softverbs::soft::link::udp::{UdpConfig, UdpPort};
//! use softverbs::soft::{SoftDevice, SoftDeviceConfig};
//!
//! let mut udp = UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
//! udp.port = UdpPort::Auto;
//! let dev = SoftDevice::create(SoftDeviceConfig::udp("rxe_like0", udp)?)?;
//! println!("GID[0] = {}", dev.gids()[0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[doc(hidden)] // address helpers; public for the provider's UDP tests
pub mod addr;
mod rx;
mod sys;
mod twin;
mod tx;

use crate::sys::lock;
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Diagnostics, Endpoint, Link, Wakeups};
use crate::soft::proto::{Counters, Datagram, Transmit};
use crate::soft::wire::{IcrcPrefix, IpPseudoHeader, UdpPorts, ROCEV2_UDP_PORT};
use crate::verbs::Gid;

#[doc(hidden)] // tuning; public for the provider's UDP tests
pub use rx::QUIET_EVERY;
pub use sys::RX_BATCH;
#[doc(hidden)] // tuning; public for the provider's UDP tests
pub use twin::CONNECT_AFTER;

/// What a UDP device binds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// One local address.
    Addr(IpAddr),
    /// Every address of a network interface (`eth0`, `veth1`), IPv6
    /// link-local addresses excepted.
    Interface(String),
}

/// Which UDP port a device binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpPort {
    /// 4791 (standard GIDs); binding fails if it is taken.
    Standard,
    /// This port (4791 gives standard GIDs, any other private ones).
    Fixed(u16),
    /// 4791 if it is free, else a free private port in 0x8000–0xBFFF.
    Auto,
}

/// When to use UDP GSO. See the module docs for why it is not always on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsoMode {
    /// Towards loopback addresses and private-GID peers only.
    Auto,
    /// Whenever the kernel supports it.
    On,
    /// Never.
    Off,
}

/// How to open a UDP link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address(es) to bind.
    pub bind: Bind,
    /// Port to bind.
    pub port: UdpPort,
    /// GSO policy.
    pub gso: GsoMode,
    /// Requested socket send and receive buffer, in bytes (raised past
    /// the sysctl limits when the process may).
    pub socket_buffer: usize,
    /// Whether single datagrams to the destination the device keeps
    /// sending to may go by a connected socket (see the module docs). On
    /// in [`UdpConfig::new`].
    pub connect: bool,
    /// Discard this share of outgoing datagrams (a test and benchmark
    /// facility, see the module docs); `None` in [`UdpConfig::new`].
    pub drop: Option<InjectedLoss>,
}

/// Seeded random loss of outgoing datagrams (see the module docs).
///
/// # Examples
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use softverbs::soft::link::udp::{InjectedLoss, UdpConfig};
///
/// let mut udp = UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
/// udp.drop = Some(InjectedLoss::new(0.01, 42)?); // 1 % of the datagrams
/// assert!(InjectedLoss::new(1.5, 42).is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedLoss {
    /// A datagram is dropped when a 32-bit draw is below this (2^32: all).
    threshold: u64,
    seed: u64,
}

impl InjectedLoss {
    /// Drops each datagram with probability `probability` (0 to 1), the
    /// draws made from `seed`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `probability` is not a number from 0 to 1.
    pub fn new(probability: f64, seed: u64) -> io::Result<InjectedLoss> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a drop probability is from 0 to 1, not {probability}"),
            ));
        }
        // Exact at both ends: 0 never drops, 1 always does.
        let threshold = (probability * 4_294_967_296.0).round() as u64;
        Ok(InjectedLoss { threshold, seed })
    }

    /// The probability, as given (to 2^-32).
    pub fn probability(&self) -> f64 {
        self.threshold as f64 / 4_294_967_296.0
    }

    /// The seed of the draws.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// The draws of an [`InjectedLoss`]: splitmix64, which any seed (0 too)
/// starts well.
#[derive(Debug, Clone)]
struct LossDraws {
    threshold: u64,
    state: u64,
}

impl LossDraws {
    fn new(l: InjectedLoss) -> LossDraws {
        LossDraws {
            threshold: l.threshold,
            state: l.seed,
        }
    }

    /// Whether the next datagram is dropped.
    fn drop_next(&mut self) -> bool {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 32) < self.threshold
    }
}

impl UdpConfig {
    /// Binds `ip` with an automatic port, GSO auto, 4 MiB socket buffers.
    pub fn new(ip: IpAddr) -> UdpConfig {
        UdpConfig {
            bind: Bind::Addr(ip),
            port: UdpPort::Auto,
            gso: GsoMode::Auto,
            socket_buffer: 4 << 20,
            connect: true,
            drop: None,
        }
    }

    /// Binds every address of interface `name`, automatic port.
    pub fn interface(name: &str) -> UdpConfig {
        UdpConfig {
            bind: Bind::Interface(name.to_string()),
            ..UdpConfig::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
        }
    }
}

/// Counters of the UDP link (what the engine never sees).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)] // each name says what it counts
pub struct UdpStats {
    pub rx_datagrams: u64,
    pub rx_syscalls: u64,
    pub rx_bad_icrc: u64,
    pub rx_truncated: u64,
    pub rx_oversized: u64,
    pub rx_errors: u64,
    pub tx_datagrams: u64,
    pub tx_messages: u64,
    pub tx_gso_messages: u64,
    pub tx_syscalls: u64,
    pub tx_unroutable: u64,
    pub tx_errors: u64,
    pub tx_backlogged: u64,
    pub tx_backlog_drops: u64,
    pub rx_gro_switches: u64,
    pub tx_connected: u64,
    pub tx_connects: u64,
    pub tx_injected_drops: u64,
}

impl UdpStats {
    /// `(name, value)` pairs, for display.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("udp_rx_datagrams", self.rx_datagrams),
            ("udp_rx_syscalls", self.rx_syscalls),
            ("udp_rx_bad_icrc", self.rx_bad_icrc),
            ("udp_rx_truncated", self.rx_truncated),
            ("udp_rx_oversized", self.rx_oversized),
            ("udp_rx_errors", self.rx_errors),
            ("udp_tx_datagrams", self.tx_datagrams),
            ("udp_tx_messages", self.tx_messages),
            ("udp_tx_gso_messages", self.tx_gso_messages),
            ("udp_tx_syscalls", self.tx_syscalls),
            ("udp_tx_unroutable", self.tx_unroutable),
            ("udp_tx_errors", self.tx_errors),
            ("udp_tx_backlogged", self.tx_backlogged),
            ("udp_tx_backlog_drops", self.tx_backlog_drops),
            ("udp_rx_gro_switches", self.rx_gro_switches),
            ("udp_tx_connected", self.tx_connected),
            ("udp_tx_connects", self.tx_connects),
            ("udp_tx_injected_drops", self.tx_injected_drops),
        ]
        .into_iter()
    }
}

#[derive(Debug, Default)]
struct AtomicStats {
    rx_datagrams: AtomicU64,
    rx_syscalls: AtomicU64,
    rx_bad_icrc: AtomicU64,
    rx_truncated: AtomicU64,
    rx_oversized: AtomicU64,
    rx_errors: AtomicU64,
    tx_datagrams: AtomicU64,
    tx_messages: AtomicU64,
    tx_gso_messages: AtomicU64,
    tx_syscalls: AtomicU64,
    tx_unroutable: AtomicU64,
    tx_errors: AtomicU64,
    tx_backlogged: AtomicU64,
    tx_backlog_drops: AtomicU64,
    rx_gro_switches: AtomicU64,
    tx_connected: AtomicU64,
    tx_connects: AtomicU64,
    tx_injected_drops: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    if n != 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// [`bump`] for a counter that only the holder of one lock writes (the
/// send side's for the send counters, the receive side's for the receive
/// counters): a plain load and store, exact under that lock, where a
/// locked add costs ~20 cycles and waits for the store buffer to drain
/// (several per datagram, and one per empty poll). Readers still see
/// whole values.
fn bump_held(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// One bound socket.
#[derive(Debug)]
struct Sock {
    sock: UdpSocket,
    local: SocketAddr,
    gid: Gid,
    /// The GID as the engine sees addresses (`gid.to_ip()`).
    view: IpAddr,
    /// Our IPv6 address (completes IPv6 private GIDs).
    local_v6: Option<Ipv6Addr>,
    /// The connected twin (see the module docs), if it could be made.
    twin: Option<UdpSocket>,
    /// Whether the twin may hold datagrams (it connected to a peer, or
    /// this device sent to itself): only then does receive read it.
    twin_live: AtomicBool,
}

impl Sock {
    /// The twin's descriptor (if any), then the bound socket's.
    fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.twin
            .as_ref()
            .map(|t| t.as_raw_fd())
            .into_iter()
            .chain(std::iter::once(self.sock.as_raw_fd()))
    }
}

/// Where datagrams from one engine address to one destination go: the
/// socket, the endpoint, GSO, and the headers their ICRC covers.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    src: IpAddr,
    dst: IpAddr,
    sock: usize,
    to: SocketAddr,
    gso: bool,
    ip: IpPseudoHeader,
    ports: UdpPorts,
    /// The twin may connect to `to` (see the module docs).
    connectable: bool,
    /// Single datagrams sent here in a row without the twin.
    streak: u32,
}

/// The send side's memory of its last destination: a ping-pong sends every
/// packet the same way, and resolving a GID to a socket and endpoint cost
/// about as much as the ICRC of a small packet.
#[derive(Debug, Default)]
struct TxFlow {
    last: Option<Resolved>,
    icrc: IcrcPrefix,
    /// Per socket: where its twin is connected (`None`: parked).
    peers: Vec<Option<SocketAddr>>,
    /// Injected loss ([`UdpConfig::drop`]), if on.
    loss: Option<LossDraws>,
}

#[derive(Debug)]
struct TxState {
    backlog: VecDeque<Transmit>,
    /// The last destination resolved and the ICRC state of its flow.
    flow: TxFlow,
    /// Per datagram of the batch being sent: (socket, destination).
    route: Vec<Option<(usize, SocketAddr, bool)>>,
    msgs: Vec<sys::TxMsg>,
}

/// A UDP link: the sockets of one soft device. See the module docs.
#[derive(Debug)]
pub struct UdpLink {
    socks: Vec<Sock>,
    rx: Mutex<sys::RxBufs>,
    tx: Mutex<TxState>,
    gso_mode: GsoMode,
    gso_ok: AtomicBool,
    detached: AtomicBool,
    /// The caller is about to sleep on (or was woken by) a poller that may
    /// be edge-triggered: the next receive reads every socket until dry
    /// (no probe, no skipping of quiet sockets), so that no datagram whose
    /// readiness was already reported stays behind.
    armed: AtomicBool,
    stats: AtomicStats,
    rcvbuf: i32,
}

impl UdpLink {
    /// Binds the sockets `cfg` describes.
    ///
    /// # Errors
    ///
    /// The bind error (`AddrInUse` for a taken fixed or standard port,
    /// `AddrNotAvailable` for an address this host does not have),
    /// `NotFound` for an interface without usable addresses, or the error
    /// of a socket option that must succeed (DF).
    pub fn bind(cfg: &UdpConfig) -> io::Result<Arc<UdpLink>> {
        let ips = match &cfg.bind {
            Bind::Addr(ip) => vec![*ip],
            Bind::Interface(name) => {
                let ips = sys::interface_addrs(name)?;
                if ips.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("interface {name} has no usable address"),
                    ));
                }
                ips
            }
        };
        if ips.iter().any(|ip| ip.is_unspecified()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a soft device binds a real address (its GID is made from it), not a wildcard",
            ));
        }
        // One port for every address of the device.
        let bound = match cfg.port {
            UdpPort::Standard => Self::bind_all(&ips, ROCEV2_UDP_PORT)?,
            UdpPort::Fixed(p) => Self::bind_all(&ips, p)?,
            UdpPort::Auto => Self::bind_auto(&ips)?,
        };
        let mut socks = Vec::new();
        let mut rcvbuf = i32::MAX;
        let want = i32::try_from(cfg.socket_buffer).unwrap_or(i32::MAX);
        for (ip, sock) in ips.into_iter().zip(bound) {
            sock.set_nonblocking(true)?;
            let fd = sock.as_raw_fd();
            sys::set_dont_fragment(fd, ip.is_ipv6())?;
            rcvbuf = rcvbuf.min(sys::set_buffer(fd, true, want));
            sys::set_buffer(fd, false, want);
            let local = sock.local_addr()?;
            let twin = if cfg.connect {
                Self::twin_of(&sock, local, want)
            } else {
                None
            };
            let gid = addr::gid_of(local);
            let local_v6 = match ip {
                IpAddr::V6(v6) => Some(v6),
                IpAddr::V4(_) => None,
            };
            socks.push(Sock {
                sock,
                local,
                gid,
                view: gid.to_ip(),
                local_v6,
                twin_live: AtomicBool::new(twin.as_ref().is_some_and(|t| sys::has_waiting(t.as_raw_fd()))),
                twin,
            });
        }
        let gso_ok = cfg.gso != GsoMode::Off && socks.iter().all(|s| sys::gso_supported(s.sock.as_raw_fd()));
        // GRO: a run of equal-size datagrams (a GSO message from a peer on
        // this host, or what the NIC coalesced) arrives in one buffer. It
        // starts off and follows the traffic (`rx::GroPolicy`).
        let gro = socks.iter().flat_map(Sock::fds).all(|fd| sys::set_gro(fd, false));
        let peers = vec![None; socks.len()];
        Ok(Arc::new(UdpLink {
            socks,
            rx: Mutex::new(sys::RxBufs::new(gro)),
            tx: Mutex::new(TxState {
                backlog: VecDeque::new(),
                flow: TxFlow {
                    peers,
                    loss: cfg.drop.map(LossDraws::new),
                    ..TxFlow::default()
                },
                route: Vec::new(),
                msgs: Vec::new(),
            }),
            gso_mode: cfg.gso,
            gso_ok: AtomicBool::new(gso_ok),
            detached: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            stats: AtomicStats::default(),
            rcvbuf,
        }))
    }

    /// Binds `port` on every address.
    fn bind_all(ips: &[IpAddr], port: u16) -> io::Result<Vec<UdpSocket>> {
        ips.iter()
            .map(|ip| UdpSocket::bind(SocketAddr::new(*ip, port)))
            .collect()
    }

    /// 4791 if it is free on every address, else a port of
    /// [`addr::AUTO_PORTS`] free on every address. Binding is the test (no
    /// probe-then-bind race with another process doing the same).
    fn bind_auto(ips: &[IpAddr]) -> io::Result<Vec<UdpSocket>> {
        match Self::bind_all(ips, ROCEV2_UDP_PORT) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            r => return r,
        }
        let span = u32::from(addr::AUTO_PORTS.end - addr::AUTO_PORTS.start);
        // Start from a per-process point so that processes do not all try
        // the same ports in the same order.
        let nanos = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.subsec_nanos());
        let seed = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
        for i in 0..span {
            let port = addr::AUTO_PORTS.start + (seed.wrapping_add(i) % span) as u16;
            match Self::bind_all(ips, port) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                r => return r,
            }
        }
        Err(io::Error::new(io::ErrorKind::AddrInUse, "no free private UDP port"))
    }

    /// The device's GIDs, one per bound address.
    pub fn gids(&self) -> Vec<Gid> {
        self.socks.iter().map(|s| s.gid).collect()
    }

    /// The bound local endpoints.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.socks.iter().map(|s| s.local).collect()
    }

    /// The receive buffer the kernel granted (bytes, smallest over the
    /// sockets).
    pub fn receive_buffer(&self) -> usize {
        usize::try_from(self.rcvbuf).unwrap_or(0)
    }

    /// Whether GSO is in use (supported, allowed, and not failed).
    pub fn gso_active(&self) -> bool {
        self.gso_ok.load(Ordering::Relaxed)
    }

    /// Where datagrams to `gid` go from this device.
    pub fn endpoint_of(&self, gid: Gid) -> Option<SocketAddr> {
        let local_v6 = self.socks.iter().find_map(|s| s.local_v6);
        addr::endpoint_of(gid, local_v6)
    }

    /// A snapshot of the link's counters.
    pub fn stats(&self) -> UdpStats {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UdpStats {
            rx_datagrams: g(&s.rx_datagrams),
            rx_syscalls: g(&s.rx_syscalls),
            rx_bad_icrc: g(&s.rx_bad_icrc),
            rx_truncated: g(&s.rx_truncated),
            rx_oversized: g(&s.rx_oversized),
            rx_errors: g(&s.rx_errors),
            tx_datagrams: g(&s.tx_datagrams),
            tx_messages: g(&s.tx_messages),
            tx_gso_messages: g(&s.tx_gso_messages),
            tx_syscalls: g(&s.tx_syscalls),
            tx_unroutable: g(&s.tx_unroutable),
            tx_errors: g(&s.tx_errors),
            tx_backlogged: g(&s.tx_backlogged),
            tx_backlog_drops: g(&s.tx_backlog_drops),
            rx_gro_switches: g(&s.rx_gro_switches),
            tx_connected: g(&s.tx_connected),
            tx_connects: g(&s.tx_connects),
            tx_injected_drops: g(&s.tx_injected_drops),
        }
    }
}

impl Link for UdpLink {
    fn send_batch(&self, txs: &mut Vec<Transmit>, spent: &mut dyn FnMut(Vec<u8>)) {
        if self.detached.load(Ordering::Relaxed) {
            txs.clear();
            return;
        }
        self.transmit(txs, spent);
    }

    fn send_one(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        if self.detached.load(Ordering::Relaxed) {
            return;
        }
        self.transmit_one(t, spent);
    }

    fn recv(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        self.receive(budget, f)
    }

    fn flush(&self) -> bool {
        let mut st = lock(&self.tx);
        self.flush_backlog_locked(&mut st);
        st.backlog.is_empty()
    }

    fn poll_fds(&self) -> Vec<RawFd> {
        self.socks.iter().flat_map(Sock::fds).collect()
    }

    fn needs_icrc(&self) -> bool {
        // The link computes and checks it against the real headers.
        false
    }

    fn attach(&self, _dev: &Arc<dyn Endpoint>) {}

    fn detach(&self, _dev: &dyn Endpoint) {
        self.detached.store(true, Ordering::Relaxed);
    }

    fn name(&self) -> &'static str {
        "udp"
    }

    fn wakeups(&self) -> Option<&dyn Wakeups> {
        Some(self)
    }

    fn diagnostics(&self) -> Option<&dyn Diagnostics> {
        Some(self)
    }
}

impl Wakeups for UdpLink {
    fn woken(&self) {
        self.armed.store(true, Ordering::Release);
    }

    fn prepare_sleep(&self) -> bool {
        // The wake-up that ends the sleep is a `woken`: a probe may leave
        // a quiet socket unread, which an edge-triggered poller would not
        // report again.
        self.woken();
        true
    }
}

impl Diagnostics for UdpLink {
    fn merge_counters(&self, c: &mut Counters) {
        let s = &self.stats;
        let bad_icrc = s.rx_bad_icrc.load(Ordering::Relaxed);
        let malformed = s.rx_truncated.load(Ordering::Relaxed) + s.rx_oversized.load(Ordering::Relaxed);
        c.rx_bad_icrc += bad_icrc;
        c.rx_malformed += malformed;
        c.rx_packets += bad_icrc + malformed;
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        UdpLink::stats(self).iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drops(p: f64, seed: u64, n: usize) -> usize {
        let mut d = LossDraws::new(InjectedLoss::new(p, seed).unwrap());
        (0..n).filter(|_| d.drop_next()).count()
    }

    #[test]
    fn injected_loss_drops_its_share_and_replays_from_the_seed() {
        assert_eq!(drops(0.0, 1, 100_000), 0);
        assert_eq!(drops(1.0, 1, 100_000), 100_000);
        // 1 % of 200,000: 2,000, σ ≈ 44.
        let n = drops(0.01, 7, 200_000);
        assert!((1_700..=2_300).contains(&n), "{n}");
        let n = drops(0.3, 0, 100_000);
        assert!((29_000..=31_000).contains(&n), "{n}");
        let seq = |seed| {
            let mut d = LossDraws::new(InjectedLoss::new(0.5, seed).unwrap());
            (0..64).map(|_| d.drop_next()).collect::<Vec<_>>()
        };
        assert_eq!(seq(3), seq(3));
        assert_ne!(seq(3), seq(4));
        for bad in [-0.1, 1.01, f64::NAN] {
            assert_eq!(
                InjectedLoss::new(bad, 0).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert_eq!(InjectedLoss::new(0.25, 9).unwrap().probability(), 0.25);
    }

    /// The link drops what the injector picks before the socket, and
    /// counts it; nothing else is lost.
    #[test]
    fn a_link_with_injected_loss_sends_only_the_rest() {
        let lo = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let rx = UdpSocket::bind(SocketAddr::new(lo, 0)).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let to = rx.local_addr().unwrap();
        let mut cfg = UdpConfig::new(lo);
        cfg.port = UdpPort::Auto;
        cfg.connect = false;
        cfg.drop = Some(InjectedLoss::new(0.5, 11).unwrap());
        let link = UdpLink::bind(&cfg).unwrap();
        let src = link.gids()[0].to_ip();
        let dst = addr::gid_of(to).to_ip();
        let n = 200;
        for i in 0..n {
            let mut data = vec![0u8; 64];
            data[0] = i as u8;
            let t = Transmit {
                src,
                dst,
                src_port: 0xc000,
                dst_port: ROCEV2_UDP_PORT,
                data,
                train: None,
            };
            link.transmit_one(t, &mut drop);
        }
        let mut got = 0u64;
        let mut buf = [0u8; 64];
        while rx.recv(&mut buf).is_ok() {
            got += 1;
        }
        let s = link.stats();
        assert!(s.tx_injected_drops > 50 && s.tx_injected_drops < 150, "{s:?}");
        assert_eq!(s.tx_datagrams, got, "{s:?}");
        assert_eq!(got + s.tx_injected_drops, n, "{s:?}");
    }
}
