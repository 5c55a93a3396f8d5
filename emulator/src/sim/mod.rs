//! A deterministic simulated fabric for the soft provider's sans-IO engine.
//!
//! N nodes each run a soft device's engine ([`Core`](softverbs::soft::proto::Core));
//! links between them have latency, bandwidth, an MTU and seeded faults
//! (loss, duplication, reordering, corruption caught by the ICRC, delay
//! spikes), and partitions cut and heal paths. Virtual time jumps to the
//! next wake-up (a packet arrival or an engine timer), so seconds of
//! retransmission timeouts cost microseconds. Runs go to idle under a step
//! bound that reports livelock. Every run is a function of its seed: a
//! failing seed replays bit for bit, with a packet log of decoded headers
//! ([`Fabric::set_trace`]). (The one exception: the virtual addresses of
//! registered memory, in RETH and AtomicETH, are the allocator's; nothing
//! depends on them.)
//!
//! Layers:
//! - [`Fabric`]: nodes, links ([`LinkConfig`], [`FaultModel`],
//!   [`Partition`]), the clock and the stepping rule; [`trace`] logs it.
//! - [`conn`]: connected QP pairs with registered memory ([`Endpoint`]).
//! - [`workload`]: random verbs programs ([`Scenario`]) run against a
//!   reference model that checks memory, completions, atomics and
//!   placement-before-completion.
//! - [`bench`](mod@bench): goodput and completion latency in virtual time under loss.
//!
//! # Examples
//!
//! ```
//! use softverbs_emulator::sim::{connect, Fabric, LinkConfig, NodeConfig, QpOptions};
//! use softverbs::verbs::{SendFlags, SendOp, SendWr};
//!
//! let mut f = Fabric::new(42, LinkConfig::ideal());
//! let a = f.add_node(NodeConfig::new("a", "10.0.0.1".parse().unwrap()));
//! let b = f.add_node(NodeConfig::new("b", "10.0.0.2".parse().unwrap()));
//! let (ea, eb) = connect(&mut f, a, b, 4096, 4096, &QpOptions::default()).unwrap();
//! ea.write(0, b"hello");
//! let sgl = [ea.sge(0, 5)];
//! let wr = SendWr::new(1, SendOp::Write { remote: eb.remote(100) }, &sgl).flags(SendFlags::SIGNALED);
//! ea.post_send(&mut f, &[wr]).unwrap();
//! f.run_until_idle(10_000).unwrap();
//! assert_eq!(eb.read(100, 5), b"hello");
//! assert!(ea.poll_send(&mut f)[0].is_success());
//! ```

pub mod bench;
pub mod conn;
mod fabric;
pub mod link;
pub mod rng;
pub mod trace;
pub mod workload;

pub use conn::{connect, pair, Endpoint, QpOptions};
pub use fabric::{
    sim_device_attr, sim_port_attr, Fabric, FabricStats, FilterPacket, NodeConfig, NodeId, PacketFilter, SimError,
    Verdict,
};
pub use link::{FaultModel, LinkConfig, Partition};
pub use rng::SimRng;
pub use workload::{Scenario, Violation};
