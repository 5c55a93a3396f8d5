//! Links of the simulated fabric: latency, bandwidth, MTU and seeded faults,
//! and network partitions.

use softverbs::soft::proto::Nanos;

use super::NodeId;

/// Seeded faults a link injects, each an independent per-packet probability.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultModel {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a packet is held back by a random extra delay of up
    /// to [`FaultModel::reorder_ns`], so later packets overtake it.
    pub reorder: f64,
    /// Largest extra delay of a reordered packet.
    pub reorder_ns: Nanos,
    /// Probability that one random bit of a packet is flipped (the
    /// receiver's ICRC check must catch it).
    pub corrupt: f64,
    /// Probability of a delay spike: the packet arrives
    /// [`FaultModel::spike_ns`] late (long enough to fire retransmission
    /// timers, so the original and its retransmission both arrive).
    pub spike: f64,
    /// The delay of a spike.
    pub spike_ns: Nanos,
}

impl FaultModel {
    /// No faults at all.
    pub const NONE: FaultModel = FaultModel {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_ns: 0,
        corrupt: 0.0,
        spike: 0.0,
        spike_ns: 0,
    };

    /// Only loss, with probability `p`.
    pub fn lossy(p: f64) -> FaultModel {
        FaultModel {
            loss: p,
            ..FaultModel::NONE
        }
    }

    /// Whether every fault is off.
    pub fn is_none(&self) -> bool {
        self.loss <= 0.0 && self.duplicate <= 0.0 && self.reorder <= 0.0 && self.corrupt <= 0.0 && self.spike <= 0.0
    }
}

/// One direction of a link between two nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency_ns: Nanos,
    /// Line rate in bits per second; packets are serialised one after the
    /// other at this rate (0: infinitely fast).
    pub bandwidth_bps: u64,
    /// Largest UDP payload the link carries; bigger datagrams are dropped
    /// (as a router drops an oversized packet with DF set).
    pub mtu: usize,
    /// Seeded faults.
    pub faults: FaultModel,
}

impl LinkConfig {
    /// A fault-free 100 Gb/s link with 2 µs latency and room for 4096-byte
    /// RoCE payloads.
    pub const fn ideal() -> LinkConfig {
        LinkConfig {
            latency_ns: 2_000,
            bandwidth_bps: 100_000_000_000,
            mtu: 4096 + 64,
            faults: FaultModel::NONE,
        }
    }

    /// Time to serialise `bytes` onto the link.
    pub fn serialization_ns(&self, bytes: usize) -> Nanos {
        if self.bandwidth_bps == 0 {
            return 0;
        }
        // Account for the IP, UDP and Ethernet overhead of a RoCEv2 packet
        // (20 + 8 + 18 bytes) so that small packets cost realistic time.
        let bits = (bytes as u128 + 46) * 8;
        (bits * 1_000_000_000 / u128::from(self.bandwidth_bps)) as Nanos
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig::ideal()
    }
}

/// A network partition: every packet between a node of `side` and a node
/// not in it is dropped while the partition holds (checked both when the
/// packet is sent and when it would arrive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// One side of the cut (the other side is every other node).
    pub side: Vec<NodeId>,
    /// When the partition starts.
    pub start: Nanos,
    /// When it heals (`None`: never).
    pub end: Option<Nanos>,
}

impl Partition {
    /// Whether the partition cuts `a`–`b` at time `t`.
    pub fn cuts(&self, a: NodeId, b: NodeId, t: Nanos) -> bool {
        let before_end = match self.end {
            Some(e) => t < e,
            None => true,
        };
        let active = t >= self.start && before_end;
        active && (self.side.contains(&a) != self.side.contains(&b))
    }
}
