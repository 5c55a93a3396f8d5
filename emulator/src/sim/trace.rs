//! The packet log of a simulated run: every packet sent, delivered, dropped,
//! duplicated or corrupted, and every timer that fired, with the decoded
//! RoCEv2 headers. Enable it with [`Fabric::set_trace`](super::Fabric::set_trace)
//! to replay a failing seed and see what happened.

use std::fmt::{self, Write as _};

use softverbs::soft::proto::Nanos;
use softverbs::soft::wire::{Packet, Syndrome};

use super::NodeId;

/// Why the fabric dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Random loss.
    Loss,
    /// A partition cut the path.
    Partition,
    /// Larger than the link MTU.
    Mtu,
    /// No node owns the destination address.
    NoRoute,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropReason::Loss => "loss",
            DropReason::Partition => "partition",
            DropReason::Mtu => "mtu",
            DropReason::NoRoute => "no-route",
        })
    }
}

/// What happened to a packet (or a node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// A node transmitted the packet; it arrives at the given time.
    Send {
        /// Scheduled arrival.
        arrive: Nanos,
    },
    /// The packet was delivered to its destination node.
    Deliver,
    /// The fabric dropped the packet.
    Drop(DropReason),
    /// The fabric will deliver a second copy at the given time.
    Duplicate {
        /// Arrival of the copy.
        arrive: Nanos,
    },
    /// The fabric flipped a bit of the packet (bit index).
    Corrupt {
        /// The flipped bit.
        bit: usize,
    },
    /// A node's timer fired.
    Timer,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Virtual time.
    pub time: Nanos,
    /// The node that sent the packet (or whose timer fired).
    pub from: NodeId,
    /// The destination node, when known.
    pub to: Option<NodeId>,
    /// What happened.
    pub kind: TraceKind,
    /// The decoded headers (empty for timers).
    pub packet: String,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>14} ", fmt_time(self.time))?;
        let to = self.to.map_or_else(|| "?".to_string(), |n| n.to_string());
        match self.kind {
            TraceKind::Send { arrive } => write!(
                f,
                "{}->{} send   (arrives {})  {}",
                self.from,
                to,
                fmt_time(arrive),
                self.packet
            ),
            TraceKind::Deliver => write!(f, "{}->{} recv   {}", self.from, to, self.packet),
            TraceKind::Drop(r) => write!(f, "{}->{} DROP({r})  {}", self.from, to, self.packet),
            TraceKind::Duplicate { arrive } => write!(
                f,
                "{}->{} DUP    (copy arrives {})  {}",
                self.from,
                to,
                fmt_time(arrive),
                self.packet
            ),
            TraceKind::Corrupt { bit } => write!(f, "{}->{} CORRUPT(bit {bit})  {}", self.from, to, self.packet),
            TraceKind::Timer => write!(f, "{}    timer", self.from),
        }
    }
}

/// `12.345678ms`-style virtual time.
pub fn fmt_time(t: Nanos) -> String {
    format!("{}.{:06}ms", t / 1_000_000, t % 1_000_000)
}

/// One-line summary of a RoCEv2 UDP payload: opcode, destination QP, PSN,
/// flags, extension headers and payload length.
pub fn describe_packet(data: &[u8]) -> String {
    let p = match Packet::parse(data) {
        Ok(p) => p,
        Err(e) => return format!("<unparsable: {e}> ({} bytes)", data.len()),
    };
    let h = &p.headers;
    let mut s = String::new();
    let _ = write!(
        s,
        "{} qp={:#x} psn={}",
        h.bth.opcode,
        h.bth.dest_qpn.value(),
        h.bth.psn.value()
    );
    if h.bth.ack_req {
        s.push_str(" A");
    }
    if h.bth.solicited {
        s.push_str(" SE");
    }
    if let Some(r) = h.reth {
        let _ = write!(s, " reth(va={:#x} rkey={:#x} len={})", r.va, r.rkey, r.dma_len);
    }
    if let Some(a) = h.aeth {
        let syn = match a.syndrome {
            Syndrome::Ack { .. } => "ACK".to_string(),
            Syndrome::RnrNak { timer } => format!("RNR-NAK(timer {timer})"),
            Syndrome::Nak(code) => format!("NAK({code:?})"),
            Syndrome::Reserved(b) => format!("reserved({b:#x})"),
        };
        let _ = write!(s, " aeth({syn} msn={})", a.msn);
    }
    if let Some(a) = h.atomic_eth {
        let _ = write!(
            s,
            " atomic(va={:#x} rkey={:#x} swap_add={:#x} cmp={:#x})",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = h.atomic_ack_eth {
        let _ = write!(s, " orig={:#x}", a.original_value);
    }
    if let Some(i) = h.immdt {
        let _ = write!(s, " imm={:#x}", u32::from_be_bytes(i.data));
    }
    if let Some(i) = h.ieth {
        let _ = write!(s, " inv={:#x}", i.rkey);
    }
    if let Some(d) = h.deth {
        let _ = write!(s, " deth(qkey={:#x} src={:#x})", d.qkey, d.src_qpn.value());
    }
    let _ = write!(s, " len={}", p.payload.len());
    s
}

/// The log: every event in order, optionally capped to the most recent
/// `limit` events.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    events: std::collections::VecDeque<TraceEvent>,
    limit: Option<usize>,
    dropped: u64,
}

impl Trace {
    /// An empty log keeping at most `limit` events (`None`: all).
    pub fn new(limit: Option<usize>) -> Trace {
        Trace {
            events: Default::default(),
            limit,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, e: TraceEvent) {
        if let Some(l) = self.limit {
            if self.events.len() >= l {
                self.events.pop_front();
                self.dropped += 1;
            }
        }
        self.events.push_back(e);
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &TraceEvent> {
        self.events.iter()
    }

    /// Number of events kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing was logged.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The log as text, one event per line (the last `tail` events only if
    /// given).
    pub fn render(&self, tail: Option<usize>) -> String {
        let skip = tail.map_or(0, |t| self.events.len().saturating_sub(t));
        let mut out = String::new();
        if self.dropped > 0 || skip > 0 {
            let _ = writeln!(out, "... {} earlier events not shown", self.dropped + skip as u64);
        }
        for e in self.events.iter().skip(skip) {
            let _ = writeln!(out, "{e}");
        }
        out
    }
}
