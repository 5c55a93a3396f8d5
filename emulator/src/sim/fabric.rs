//! The simulated fabric: nodes running soft-device engines ([`Core`]),
//! links between them, and a virtual clock that jumps to the next wake-up
//! (a packet arrival or an engine timer).
//!
//! One step handles exactly one event: the earliest packet arrival (ties in
//! send order), else the earliest engine timer (ties in node order). After
//! every input the node's engine is drained in the documented call order
//! (transmit, then events; the timer is re-read from `poll_timeout` when
//! the next step is chosen). Every random choice comes from the fabric's
//! seed, so a run is a pure function of its seed and its inputs.
//!
//! A node that coalesces ACKs ([`NodeConfig::coalesce_acks`]) stands for an
//! inline device, whose application reads the link inside its next verb:
//! the output of a packet delivered to it waits for the next call on that
//! node in the same instant ([`Fabric::with`], where polling completions
//! lets the engine hold that output's ACKs back), and leaves at the latest
//! when the next step starts. Its held ACKs leave at their bound, when the
//! engine's timer fires (or earlier, with other output).

use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::net::IpAddr;

use softverbs::soft::device::limits;
use softverbs::soft::proto::{
    by_reference, Core, CoreConfig, CoreEvent, Datagram, Nanos, Recovery, TrainRoute, Transmit,
};
use softverbs::verbs::{AtomicCap, DeviceAttr, DeviceCapFlags, Gid, Guid, LinkLayer, Mtu, PortAttr, PortState};

use super::link::{LinkConfig, Partition};
use super::rng::SimRng;
use super::trace::{describe_packet, DropReason, Trace, TraceEvent, TraceKind};

/// A node of the fabric (index in creation order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// How to create a node: one soft device with one address.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Name, for reports.
    pub name: String,
    /// The node's address (its GID 0).
    pub addr: IpAddr,
    /// Engine option: ACK request at least every this many packets.
    pub ack_every: u32,
    /// Engine option: most unacknowledged request packets per QP.
    pub max_inflight_packets: u32,
    /// Engine option: verify received ICRCs (leave on: corruption faults
    /// rely on it).
    pub check_icrc: bool,
    /// Engine option: the loss recovery the node offers its peers.
    pub recovery: Recovery,
    /// Engine option: hold plain ACKs back when the application polls
    /// completions (`Core::set_ack_coalescing`); the node then drains a
    /// delivered packet's output after the application's next call (see
    /// the module docs).
    pub coalesce_acks: bool,
}

impl NodeConfig {
    /// A node with the soft device's default engine options.
    pub fn new(name: &str, addr: IpAddr) -> NodeConfig {
        NodeConfig {
            name: name.to_string(),
            addr,
            ack_every: 64,
            max_inflight_packets: 1024,
            check_icrc: true,
            recovery: Recovery::default(),
            coalesce_acks: false,
        }
    }
}

/// Device attributes of a simulated node (those of a soft device).
pub fn sim_device_attr(guid: Guid) -> DeviceAttr {
    DeviceAttr {
        fw_ver: "sim".to_string(),
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: 1 << 40,
        page_size_cap: 0xffff_f000,
        vendor_id: 0x53_5646,
        vendor_part_id: 2,
        hw_ver: 0,
        max_qp: limits::MAX_QP,
        max_qp_wr: limits::MAX_QP_WR,
        device_cap_flags: DeviceCapFlags::RC_RNR_NAK_GEN | DeviceCapFlags::CURR_QP_STATE_MOD,
        max_sge: limits::MAX_SGE,
        max_sge_rd: limits::MAX_SGE,
        max_cq: limits::MAX_CQ,
        max_cqe: limits::MAX_CQE,
        max_mr: limits::MAX_MR,
        max_pd: limits::MAX_PD,
        max_qp_rd_atom: limits::MAX_QP_RD_ATOM,
        max_res_rd_atom: limits::MAX_QP_RD_ATOM * 1024,
        max_qp_init_rd_atom: limits::MAX_QP_RD_ATOM,
        atomic_cap: Some(AtomicCap::Hca),
        max_mw: limits::MAX_MW,
        max_ah: limits::MAX_AH,
        max_srq: limits::MAX_SRQ,
        max_srq_wr: limits::MAX_SRQ_WR,
        max_srq_sge: limits::MAX_SGE,
        max_pkeys: limits::PKEY_TBL_LEN,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        max_fast_reg_page_list_len: limits::MAX_FAST_REG_PAGES,
        max_inline_data: limits::MAX_INLINE_DATA,
    }
}

/// Port attributes of a simulated node.
pub fn sim_port_attr() -> PortAttr {
    PortAttr {
        state: PortState::Active,
        max_mtu: Mtu::Mtu4096,
        active_mtu: Mtu::Mtu4096,
        gid_tbl_len: limits::GID_TBL_LEN,
        port_cap_flags: 0,
        max_msg_sz: limits::MAX_MSG_SZ,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: limits::PKEY_TBL_LEN,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        active_width: 2,
        active_speed: 32,
        phys_state: 5,
        link_layer: LinkLayer::Ethernet,
    }
}

/// What a fabric-level packet filter decides (see [`Fabric::set_filter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the link handle the packet (its own faults still apply).
    Pass,
    /// Drop it (logged as loss).
    Drop,
    /// Deliver it this much later than the link would.
    Delay(Nanos),
    /// Deliver it twice.
    Duplicate,
    /// Deliver it, and a second copy this much later.
    DuplicateAfter(Nanos),
}

/// What a packet filter sees.
#[derive(Debug, Clone, Copy)]
pub struct FilterPacket<'a> {
    /// Virtual time of the send.
    pub time: Nanos,
    /// Sending node.
    pub from: NodeId,
    /// Destination node.
    pub to: NodeId,
    /// The RoCEv2 UDP payload (parse it with `softverbs::soft::wire::Packet`).
    pub data: &'a [u8],
}

/// A scripted fault: decides per packet, before the link's random faults.
pub type PacketFilter = Box<dyn FnMut(&FilterPacket<'_>) -> Verdict + Send>;

/// Counters of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Events handled.
    pub steps: u64,
    /// Packets transmitted by engines.
    pub sent: u64,
    /// Packets handed to engines.
    pub delivered: u64,
    /// Payload bytes handed to engines.
    pub delivered_bytes: u64,
    /// Packets lost (random loss or a filter).
    pub lost: u64,
    /// Packets dropped by partitions.
    pub partitioned: u64,
    /// Packets over the link MTU.
    pub oversized: u64,
    /// Packets to an address no node owns.
    pub unroutable: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Packets with a flipped bit.
    pub corrupted: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Packets delayed by a spike.
    pub spiked: u64,
    /// Engine timers that fired.
    pub timers: u64,
}

/// A run did not reach idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// The step bound was reached with work still pending: a livelock (or a
    /// bound too small for the workload).
    Livelock {
        /// Steps taken in this run.
        steps: u64,
        /// Virtual time reached.
        now: Nanos,
        /// Packets still in flight.
        in_flight: usize,
        /// The earliest engine timer still armed.
        next_timer: Option<Nanos>,
        /// The fabric's seed, to replay.
        seed: u64,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Livelock {
                steps,
                now,
                in_flight,
                next_timer,
                seed,
            } => write!(
                f,
                "livelock: not idle after {steps} steps (virtual time {}, {in_flight} packets in flight, \
                 next timer {}); replay with seed {seed:#x}",
                super::trace::fmt_time(*now),
                next_timer.map_or_else(|| "none".to_string(), super::trace::fmt_time),
            ),
        }
    }
}

impl std::error::Error for SimError {}

struct Node {
    name: String,
    addr: IpAddr,
    core: Core,
    events: Vec<(Nanos, CoreEvent)>,
    /// Drains a delivered packet's output after the application's next
    /// call ([`NodeConfig::coalesce_acks`]).
    inline: bool,
}

struct LinkState {
    cfg: LinkConfig,
    busy_until: Nanos,
}

struct InFlight {
    at: Nanos,
    seq: u64,
    from: NodeId,
    to: NodeId,
    tx: Transmit,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // BinaryHeap is a max-heap: the earliest (time, seq) is the greatest.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// N nodes, their links, a virtual clock and seeded faults. See the module
/// docs for the stepping rule.
pub struct Fabric {
    seed: u64,
    now: Nanos,
    rng: SimRng,
    nodes: Vec<Node>,
    by_addr: HashMap<IpAddr, NodeId>,
    default_link: LinkConfig,
    links: HashMap<(NodeId, NodeId), LinkState>,
    partitions: Vec<Partition>,
    queue: BinaryHeap<InFlight>,
    seq: u64,
    trace: Option<Trace>,
    filter: Option<PacketFilter>,
    stats: FabricStats,
    /// An inline node whose delivered packet's output was not drained yet.
    pending: Option<NodeId>,
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fabric")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .field("nodes", &self.nodes.iter().map(|n| &n.name).collect::<Vec<_>>())
            .field("in_flight", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Fabric {
    /// An empty fabric whose links default to `link`; every random choice
    /// derives from `seed`.
    pub fn new(seed: u64, link: LinkConfig) -> Fabric {
        Fabric {
            seed,
            now: 0,
            rng: SimRng::derive(seed, 0xfab),
            nodes: Vec::new(),
            by_addr: HashMap::new(),
            default_link: link,
            links: HashMap::new(),
            partitions: Vec::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            trace: None,
            filter: None,
            stats: FabricStats::default(),
            pending: None,
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time now.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Counters.
    pub fn stats(&self) -> &FabricStats {
        &self.stats
    }

    /// Adds a node running a fresh engine seeded from the fabric's seed.
    ///
    /// # Panics
    ///
    /// If another node owns the address.
    pub fn add_node(&mut self, cfg: NodeConfig) -> NodeId {
        assert!(!self.by_addr.contains_key(&cfg.addr), "address {} is taken", cfg.addr);
        let id = NodeId(self.nodes.len());
        let gid = Gid::from_ip(cfg.addr);
        let guid = Guid(0x0253_7600_0000_0000 | id.0 as u64);
        let mut core_cfg = CoreConfig::new(
            sim_device_attr(guid),
            sim_port_attr(),
            vec![gid],
            SimRng::derive(self.seed, 0x1000 + id.0 as u64).next_u64(),
        );
        core_cfg.ack_every = cfg.ack_every;
        core_cfg.max_inflight_packets = cfg.max_inflight_packets;
        core_cfg.check_icrc = cfg.check_icrc;
        core_cfg.recovery = cfg.recovery;
        self.by_addr.insert(cfg.addr, id);
        let mut core = Core::new(core_cfg);
        core.set_ack_coalescing(cfg.coalesce_acks);
        self.nodes.push(Node {
            name: cfg.name,
            addr: cfg.addr,
            core,
            events: Vec::new(),
            inline: cfg.coalesce_acks,
        });
        id
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// A node's name.
    pub fn name(&self, node: NodeId) -> &str {
        &self.nodes[node.0].name
    }

    /// A node's address.
    pub fn addr(&self, node: NodeId) -> IpAddr {
        self.nodes[node.0].addr
    }

    /// A node's GID 0.
    pub fn gid(&self, node: NodeId) -> Gid {
        Gid::from_ip(self.nodes[node.0].addr)
    }

    /// Lets `node` send RC SENDs and WRITEs of 2 KiB or more from
    /// shareable buffers as trains (`softverbs::soft::proto::by_reference`):
    /// one packet standing for the message, which faults drop, duplicate,
    /// delay and reorder like any other.
    pub fn enable_trains(&mut self, node: NodeId) {
        self.nodes[node.0].core.set_train_route(std::sync::Arc::new(AllTrains));
    }

    /// Sets the link `from → to`.
    pub fn set_link(&mut self, from: NodeId, to: NodeId, cfg: LinkConfig) {
        let busy_until = self.links.get(&(from, to)).map_or(0, |l| l.busy_until);
        self.links.insert((from, to), LinkState { cfg, busy_until });
    }

    /// Sets both directions between `a` and `b`.
    pub fn set_links(&mut self, a: NodeId, b: NodeId, cfg: LinkConfig) {
        self.set_link(a, b, cfg);
        self.set_link(b, a, cfg);
    }

    /// The link `from → to`.
    pub fn link(&self, from: NodeId, to: NodeId) -> LinkConfig {
        self.links.get(&(from, to)).map_or(self.default_link, |l| l.cfg)
    }

    /// Adds a partition.
    pub fn add_partition(&mut self, p: Partition) {
        self.partitions.push(p);
    }

    /// Cuts `node` off from every other node from now on, for good (the
    /// peer is gone).
    pub fn isolate(&mut self, node: NodeId) {
        let now = self.now;
        self.partitions.push(Partition {
            side: vec![node],
            start: now,
            end: None,
        });
    }

    /// Removes every partition (the network heals now).
    pub fn heal(&mut self) {
        self.partitions.clear();
    }

    /// Installs a scripted per-packet fault (replacing any previous one).
    pub fn set_filter(&mut self, f: PacketFilter) {
        self.filter = Some(f);
    }

    /// Removes the scripted fault.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Starts logging packets, keeping the last `limit` events (`None`: all).
    pub fn set_trace(&mut self, limit: Option<usize>) {
        self.trace = Some(Trace::new(limit));
    }

    /// The packet log, if enabled.
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    /// A node's engine, for queries (`poll_cq` and verbs go through
    /// [`Fabric::with`], so their output is sent).
    pub fn core(&self, node: NodeId) -> &Core {
        &self.nodes[node.0].core
    }

    /// Runs `f` on a node's engine at the current virtual time, then sends
    /// what it transmitted and collects its events.
    pub fn with<R>(&mut self, node: NodeId, f: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        let now = self.now;
        let r = f(&mut self.nodes[node.0].core, now);
        if self.pending == Some(node) {
            self.pending = None;
        }
        self.flush(node);
        r
    }

    /// Events (CQ notifications, async events) a node's engine reported,
    /// with their time, and clears them.
    pub fn take_events(&mut self, node: NodeId) -> Vec<(Nanos, CoreEvent)> {
        std::mem::take(&mut self.nodes[node.0].events)
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// The earliest engine timer.
    pub fn next_timer(&self) -> Option<(Nanos, NodeId)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.core.poll_timeout().map(|t| (t, NodeId(i))))
            .min()
    }

    /// When the next event is due (`None`: the fabric is idle).
    pub fn next_wakeup(&self) -> Option<Nanos> {
        let pkt = self.queue.peek().map(|p| p.at);
        let timer = self.next_timer().map(|(t, _)| t);
        match (pkt, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether nothing is in flight, no output waits and no timer is armed.
    pub fn is_idle(&self) -> bool {
        self.pending.is_none() && self.next_wakeup().is_none()
    }

    /// Handles the next event, whenever it is due; `false` if idle.
    pub fn step(&mut self) -> bool {
        self.step_until(Nanos::MAX)
    }

    /// Handles the next event if it is due by `limit`; otherwise moves the
    /// clock to `limit` (if later than now) and returns `false`.
    pub fn step_until(&mut self, limit: Nanos) -> bool {
        // The output an inline node's application did not take in the
        // instant it was produced leaves now.
        if let Some(node) = self.pending.take() {
            self.flush(node);
        }
        let pkt = self.queue.peek().map(|p| p.at);
        let timer = self.next_timer();
        let take_packet = match (pkt, timer) {
            (Some(p), Some((t, _))) => p <= t,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                if limit != Nanos::MAX {
                    self.now = self.now.max(limit);
                }
                return false;
            }
        };
        let due = if take_packet {
            pkt.unwrap_or(0)
        } else {
            timer.map_or(0, |t| t.0)
        };
        if due > limit {
            self.now = self.now.max(limit);
            return false;
        }
        self.now = self.now.max(due);
        self.stats.steps += 1;
        if take_packet {
            let p = self.queue.pop().expect("peeked");
            self.deliver(p);
        } else {
            let (_, node) = timer.expect("timer chosen");
            self.stats.timers += 1;
            if let Some(tr) = &mut self.trace {
                tr.push(TraceEvent {
                    time: self.now,
                    from: node,
                    to: None,
                    kind: TraceKind::Timer,
                    packet: String::new(),
                });
            }
            let now = self.now;
            self.nodes[node.0].core.handle_timeout(now);
            self.flush(node);
        }
        true
    }

    /// Runs until idle.
    ///
    /// # Errors
    ///
    /// [`SimError::Livelock`] after `max_steps` steps without reaching idle.
    pub fn run_until_idle(&mut self, max_steps: u64) -> Result<u64, SimError> {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            if steps >= max_steps && !self.is_idle() {
                return Err(self.livelock(steps));
            }
        }
        Ok(steps)
    }

    /// Runs every event due by `deadline`, then sets the clock to it.
    ///
    /// # Errors
    ///
    /// [`SimError::Livelock`] after `max_steps` steps.
    pub fn run_until(&mut self, deadline: Nanos, max_steps: u64) -> Result<u64, SimError> {
        let mut steps = 0;
        while self.step_until(deadline) {
            steps += 1;
            if steps >= max_steps {
                return Err(self.livelock(steps));
            }
        }
        Ok(steps)
    }

    /// Steps while `cond` holds (checked before each step) and the fabric is
    /// not idle; returns whether `cond` still holds at the end.
    ///
    /// # Errors
    ///
    /// [`SimError::Livelock`] after `max_steps` steps.
    pub fn run_while(&mut self, max_steps: u64, mut cond: impl FnMut(&mut Fabric) -> bool) -> Result<bool, SimError> {
        let mut steps = 0;
        loop {
            if !cond(self) {
                return Ok(false);
            }
            if !self.step() {
                return Ok(cond(self));
            }
            steps += 1;
            if steps >= max_steps {
                return Err(self.livelock(steps));
            }
        }
    }

    /// The livelock error for the current state.
    pub fn livelock(&self, steps: u64) -> SimError {
        SimError::Livelock {
            steps,
            now: self.now,
            in_flight: self.queue.len(),
            next_timer: self.next_timer().map(|t| t.0),
            seed: self.seed,
        }
    }

    // ---- packets ------------------------------------------------------

    /// Sends what a node transmitted and collects its events.
    fn flush(&mut self, node: NodeId) {
        while let Some(tx) = self.nodes[node.0].core.poll_transmit() {
            self.send(node, tx);
        }
        let now = self.now;
        let n = &mut self.nodes[node.0];
        while let Some(e) = n.core.poll_event() {
            n.events.push((now, e));
        }
    }

    fn log(&mut self, from: NodeId, to: Option<NodeId>, kind: TraceKind, data: &[u8]) {
        if let Some(tr) = &mut self.trace {
            tr.push(TraceEvent {
                time: self.now,
                from,
                to,
                kind,
                packet: describe_packet(data),
            });
        }
    }

    fn partitioned(&self, a: NodeId, b: NodeId, t: Nanos) -> bool {
        self.partitions.iter().any(|p| p.cuts(a, b, t))
    }

    fn send(&mut self, from: NodeId, mut tx: Transmit) {
        self.stats.sent += 1;
        let Some(&to) = self.by_addr.get(&tx.dst) else {
            self.stats.unroutable += 1;
            self.log(from, None, TraceKind::Drop(DropReason::NoRoute), &tx.data);
            return;
        };
        let now = self.now;
        let link = self.links.entry((from, to)).or_insert(LinkState {
            cfg: self.default_link,
            busy_until: 0,
        });
        let cfg = link.cfg;
        if tx.data.len() > cfg.mtu {
            self.stats.oversized += 1;
            self.log(from, Some(to), TraceKind::Drop(DropReason::Mtu), &tx.data);
            return;
        }
        // The packet occupies the link whether or not it survives.
        let start = link.busy_until.max(now);
        // A train occupies the link for its whole payload, as its packets
        // would.
        let wire_len = tx.data.len() + tx.train.as_ref().map_or(0, |t| t.len() as usize);
        link.busy_until = start + cfg.serialization_ns(wire_len);
        let mut arrive = link.busy_until + cfg.latency_ns;
        let verdict = match &mut self.filter {
            Some(f) => f(&FilterPacket {
                time: now,
                from,
                to,
                data: &tx.data,
            }),
            None => Verdict::Pass,
        };
        if self.partitioned(from, to, now) {
            self.stats.partitioned += 1;
            self.log(from, Some(to), TraceKind::Drop(DropReason::Partition), &tx.data);
            return;
        }
        let f = cfg.faults;
        if verdict == Verdict::Drop || self.rng.chance(f.loss) {
            self.stats.lost += 1;
            self.log(from, Some(to), TraceKind::Drop(DropReason::Loss), &tx.data);
            return;
        }
        if let Verdict::Delay(d) = verdict {
            arrive += d;
        }
        if self.rng.chance(f.spike) {
            self.stats.spiked += 1;
            arrive += f.spike_ns;
        }
        if self.rng.chance(f.reorder) {
            self.stats.reordered += 1;
            arrive += self.rng.range(1, f.reorder_ns.max(1));
        }
        if self.rng.chance(f.corrupt) && !tx.data.is_empty() {
            let bit = self.rng.below(tx.data.len() as u64 * 8) as usize;
            self.log(from, Some(to), TraceKind::Corrupt { bit }, &tx.data);
            tx.data[bit / 8] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
        }
        if let Verdict::DuplicateAfter(d) = verdict {
            self.stats.duplicated += 1;
            self.log(from, Some(to), TraceKind::Duplicate { arrive: arrive + d }, &tx.data);
            self.enqueue(arrive + d, from, to, tx.clone());
        }
        if verdict == Verdict::Duplicate || self.rng.chance(f.duplicate) {
            let extra = self.rng.range(0, cfg.latency_ns.max(1));
            let copy_at = arrive + extra;
            self.stats.duplicated += 1;
            self.log(from, Some(to), TraceKind::Duplicate { arrive: copy_at }, &tx.data);
            self.enqueue(copy_at, from, to, tx.clone());
        }
        self.log(from, Some(to), TraceKind::Send { arrive }, &tx.data);
        self.enqueue(arrive, from, to, tx);
    }

    fn enqueue(&mut self, at: Nanos, from: NodeId, to: NodeId, tx: Transmit) {
        self.seq += 1;
        self.queue.push(InFlight {
            at,
            seq: self.seq,
            from,
            to,
            tx,
        });
    }

    fn deliver(&mut self, p: InFlight) {
        if self.partitioned(p.from, p.to, self.now) {
            self.stats.partitioned += 1;
            self.log(p.from, Some(p.to), TraceKind::Drop(DropReason::Partition), &p.tx.data);
            return;
        }
        self.stats.delivered += 1;
        self.stats.delivered_bytes += p.tx.data.len() as u64;
        self.log(p.from, Some(p.to), TraceKind::Deliver, &p.tx.data);
        let now = self.now;
        // A train's payload is read from the sender's buffers, which the
        // packet keeps alive (every node lives in this process).
        let pieces = p.tx.train.as_ref().and_then(|t| t.local_pieces());
        let train = match (&p.tx.train, &pieces) {
            (Some(t), Some(pieces)) => by_reference::TrainIn::new(t.npkts, pieces),
            _ => None,
        };
        let d = Datagram {
            src: p.tx.src,
            dst: p.tx.dst,
            src_port: p.tx.src_port,
            dst_port: p.tx.dst_port,
            data: &p.tx.data,
            train,
        };
        self.nodes[p.to.0].core.handle_datagram(now, d);
        if self.nodes[p.to.0].inline {
            self.pending = Some(p.to);
        } else {
            self.flush(p.to);
        }
    }
}

/// Every node of a fabric can read every other's buffers.
struct AllTrains;

impl TrainRoute for AllTrains {
    fn train_caps(&self, _dst: IpAddr) -> by_reference::TrainCaps {
        // In-process delivery reads shareable buffers only.
        // Trains of one packet too, as to a shared-memory peer, so that
        // faults hit those as well.
        by_reference::TrainCaps {
            one_packet: true,
            ..by_reference::TrainCaps::SHARED
        }
    }
}
