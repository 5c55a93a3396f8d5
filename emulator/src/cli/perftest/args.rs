//! The command line of the perftest-style tools: the flags and their
//! values, as clap parses them ([`PerfArgs`]), with perftest's flags that
//! have no effect here ([`NoEffectArgs`]). The parameters a run resolves
//! from them are [`Params`] (in `params`, named here too).
//!
//! Flags keep perftest's letters, long names and meanings (`ib_write_bw
//! --help`); where perftest has a positional server host, `--client HOST`
//! (or the positional `HOST`) says the same.

use std::fmt;

use softverbs::soft::proto::Recovery;
use softverbs::verbs::QpType;

pub use super::params::{Mode, Params, MAX_SIZE, MIN_ITERS, PEAK_MAX_ITERS};

/// Which test to run (`softverbs perf <TEST>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum PerfTest {
    /// RDMA write bandwidth (ib_write_bw)
    #[value(name = "write_bw")]
    WriteBw,
    /// RDMA write ping-pong latency (ib_write_lat)
    #[value(name = "write_lat")]
    WriteLat,
    /// RDMA read bandwidth (ib_read_bw)
    #[value(name = "read_bw")]
    ReadBw,
    /// RDMA read latency (ib_read_lat)
    #[value(name = "read_lat")]
    ReadLat,
    /// Send/receive bandwidth (ib_send_bw)
    #[value(name = "send_bw")]
    SendBw,
    /// Send/receive ping-pong latency (ib_send_lat)
    #[value(name = "send_lat")]
    SendLat,
    /// Atomic bandwidth (ib_atomic_bw)
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// Atomic latency (ib_atomic_lat)
    #[value(name = "atomic_lat")]
    AtomicLat,
    /// Many QPs on one device pair: aggregate message rate and memory per QP
    #[value(name = "scale")]
    Scale,
}

/// The operation a test exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerbKind {
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Send/receive.
    Send,
    /// Atomic (fetch-and-add or compare-and-swap).
    Atomic,
}

impl VerbKind {
    /// perftest's name of the verb in the banner (`RDMA_Write`).
    pub fn perftest_name(self) -> &'static str {
        match self {
            VerbKind::Write => "RDMA_Write",
            VerbKind::Read => "RDMA_Read",
            VerbKind::Send => "Send",
            VerbKind::Atomic => "Atomic",
        }
    }

    /// Whether the responder's answer is data (reads and atomics): latency
    /// then reports the full round trip, as perftest does.
    pub fn is_round_trip(self) -> bool {
        matches!(self, VerbKind::Read | VerbKind::Atomic)
    }
}

impl PerfTest {
    /// The verb the test exercises (`None` for `scale`).
    pub fn verb(self) -> Option<VerbKind> {
        Some(match self {
            PerfTest::WriteBw | PerfTest::WriteLat => VerbKind::Write,
            PerfTest::ReadBw | PerfTest::ReadLat => VerbKind::Read,
            PerfTest::SendBw | PerfTest::SendLat => VerbKind::Send,
            PerfTest::AtomicBw | PerfTest::AtomicLat => VerbKind::Atomic,
            PerfTest::Scale => return None,
        })
    }

    /// Whether it is a bandwidth test (`scale` counts as one).
    pub fn is_bw(self) -> bool {
        !matches!(
            self,
            PerfTest::WriteLat | PerfTest::ReadLat | PerfTest::SendLat | PerfTest::AtomicLat
        )
    }

    /// The name on the command line (`write_bw`).
    pub fn name(self) -> &'static str {
        match self {
            PerfTest::WriteBw => "write_bw",
            PerfTest::WriteLat => "write_lat",
            PerfTest::ReadBw => "read_bw",
            PerfTest::ReadLat => "read_lat",
            PerfTest::SendBw => "send_bw",
            PerfTest::SendLat => "send_lat",
            PerfTest::AtomicBw => "atomic_bw",
            PerfTest::AtomicLat => "atomic_lat",
            PerfTest::Scale => "scale",
        }
    }

    /// The eight perftest tests, in the order the README lists them.
    pub const PERFTEST: [PerfTest; 8] = [
        PerfTest::WriteBw,
        PerfTest::WriteLat,
        PerfTest::ReadBw,
        PerfTest::ReadLat,
        PerfTest::SendBw,
        PerfTest::SendLat,
        PerfTest::AtomicBw,
        PerfTest::AtomicLat,
    ];
}

impl fmt::Display for PerfTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `-c`: the connection type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Connection {
    /// Reliable connection
    #[value(name = "RC", alias = "rc")]
    Rc,
    /// Unreliable connection
    #[value(name = "UC", alias = "uc")]
    Uc,
    /// Unreliable datagram
    #[value(name = "UD", alias = "ud")]
    Ud,
}

impl Connection {
    /// The QP type.
    pub fn qp_type(self) -> QpType {
        match self {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
        }
    }

    /// perftest's name (`RC`).
    pub fn name(self) -> &'static str {
        match self {
            Connection::Rc => "RC",
            Connection::Uc => "UC",
            Connection::Ud => "UD",
        }
    }
}

/// `-A`: the atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicType {
    /// Compare and swap
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    /// perftest's name.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// `--link`: how soft devices reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LinkKind {
    /// In-process link (both ends in this process)
    Inproc,
    /// UDP sockets (RoCEv2): two UDP devices on 127.0.0.1 in loopback,
    /// or one per end with --server/--client
    Udp,
    /// Shared-memory rings (devices on one host; the UDP link carries the
    /// rendezvous only)
    Shm,
}

impl LinkKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Inproc => "inproc",
            LinkKind::Udp => "udp",
            LinkKind::Shm => "shm",
        }
    }
}

fn parse_recovery(s: &str) -> Result<Recovery, String> {
    match s {
        "gbn" => Ok(Recovery::GoBackN),
        "sr" => Ok(Recovery::SelectiveRepeat),
        _ => Err(format!("unknown recovery {s:?} (gbn or sr)")),
    }
}

/// The arguments of `softverbs perf`.
///
/// As with perftest (getopt), a flag given twice takes its last value.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "perftest options", args_override_self = true)]
pub struct PerfArgs {
    /// The test: write_bw, write_lat, read_bw, read_lat, send_bw, send_lat,
    /// atomic_bw, atomic_lat, or scale (many QPs: message rate and memory
    /// per QP)
    #[arg(value_enum, value_name = "TEST")]
    pub test: PerfTest,
    /// Server to connect to (same as --client HOST)
    #[arg(value_name = "HOST", conflicts_with_all = ["client", "server", "loopback"])]
    pub host: Option<String>,

    /// Size of message to exchange [default: 65536 for bw, 2 for lat, 8 for
    /// atomics and scale]
    #[arg(short = 's', long = "size", value_name = "SIZE")]
    pub size: Option<u64>,
    /// Run sizes from 2 till 2^23 (up to the MTU with UD; 8 only for
    /// atomics)
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Number of exchanges (at least 5) [default: 5000 for bw, 1000 for lat]
    #[arg(short = 'n', long = "iters", value_name = "ITERS")]
    pub iters: Option<u64>,
    /// Run the test for this many seconds instead of -n iterations
    #[arg(short = 'D', long = "duration", value_name = "SECONDS", conflicts_with_all = ["iters", "all"],
          value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,
    /// Warm-up and cool-down margin of a -D run, in seconds
    #[arg(short = 'f', long = "margin", value_name = "SECONDS", default_value_t = 2)]
    pub margin: u64,
    /// Size of the tx queue [default: 128 for bw, 1 for lat]
    #[arg(short = 't', long = "tx-depth", value_name = "DEPTH",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tx_depth: Option<u32>,
    /// Local ACK timeout of RC QPs, 4.096 µs · 2^N per try (0: none)
    #[arg(short = 'u', long = "qp-timeout", value_name = "N", default_value_t = super::resources::DEF_QP_TIME,
          value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Size of the rx queue (send tests) [default: 512]
    #[arg(short = 'r', long = "rx-depth", value_name = "DEPTH",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: Option<u32>,
    /// Generate a CQE only every N sends (bw tests and send_lat, as
    /// perftest) [default: 100]
    #[arg(short = 'Q', long = "cq-mod", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub cq_mod: Option<u32>,
    /// Max size of message to be sent inline [default: 0 for bw; 220 for
    /// write_lat, 236 for send_lat (188 on UD)]
    #[arg(short = 'I', long = "inline_size", value_name = "SIZE")]
    pub inline_size: Option<u32>,
    /// Connection type
    #[arg(
        short = 'c',
        long = "connection",
        value_enum,
        default_value = "RC",
        value_name = "RC|UC|UD"
    )]
    pub connection: Connection,
    /// Number of QPs
    #[arg(short = 'q', long = "qp", value_name = "QPS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub qps: u32,
    /// Measure bidirectional bandwidth (default unidirectional)
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// MTU size: 256 - 4096 [default: the port's active MTU]
    #[arg(short = 'm', long = "mtu", value_name = "MTU")]
    pub mtu: Option<u32>,
    /// Post a list of N send WQEs per post (instead of single post)
    #[arg(short = 'l', long = "post_list", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub post_list: u32,
    /// Sleep on CQ events (a completion channel) instead of busy polling
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Buffers from the process heap, as a C program's `ibv_reg_mr` gives
    /// (never shareable with a peer process, so the shared-memory link
    /// copies them through its rings), instead of memory the provider
    /// allocates
    #[arg(long = "heap")]
    pub heap: bool,
    /// Atomic operation
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD",
        value_name = "TYPE"
    )]
    pub atomic_type: AtomicType,
    /// Outstanding reads/atomics [default: the device's max_qp_rd_atom, at most 16]
    #[arg(short = 'o', long = "outs", value_name = "N")]
    pub outs: Option<u32>,
    /// Cancel peak-bw calculation (default with peak up to iters=20000)
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Report Max/Average BW in Gbit/sec (instead of MB/sec, where perftest
    /// 4.5's MB is 2^20 bytes)
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Decimal places of the latency figures (perftest prints 2: a step of
    /// 10 ns, ~3 % of a shared-memory one-way trip)
    #[arg(long = "digits", value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u8).range(0..=6))]
    pub digits: u8,
    /// Latency tests: switch softverbs::soft::experiment per block of N iterations
    /// and print the median of either arm's blocks (an experiment inside
    /// one run; needs a build with the `ab` feature)
    #[arg(long = "ab", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub ab: Option<u64>,
    /// Also save the report as JSON in FILE
    #[arg(long = "out_json", value_name = "FILE", num_args = 0..=1,
          default_missing_value = "perftest_out.json")]
    pub out_json: Option<String>,
    /// Name of the JSON report file (implies --out_json)
    #[arg(long = "out_json_file", value_name = "FILE")]
    pub out_json_file: Option<String>,

    /// Use IB device DEV [default: the first device; softverbs_0 in loopback]
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Use port PORT of the device
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// GID index [default: the first populated GID]
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u8>,
    /// Listen on/connect to TCP port PORT for the address exchange
    #[arg(short = 'p', long = "port", value_name = "PORT", default_value_t = 18515)]
    pub port: u16,

    /// Both ends in this process (the default): the local device and
    /// --peer-dev, joined by the soft provider's in-process link
    #[arg(long, help_heading = "softverbs options", conflicts_with_all = ["server", "client"])]
    pub loopback: bool,
    /// Wait for a client to connect (perftest's mode with no host)
    #[arg(long, help_heading = "softverbs options", conflicts_with = "client")]
    pub server: bool,
    /// Connect to the server on HOST and run the test against it
    #[arg(long, value_name = "HOST", help_heading = "softverbs options")]
    pub client: Option<String>,
    /// The loopback peer device [default: the other embedded soft device;
    /// the same device with --backend hw]
    #[arg(long, value_name = "DEV", help_heading = "softverbs options")]
    pub peer_dev: Option<String>,
    /// Link between soft devices: inproc (in this process), udp, or shm
    /// (shared-memory rings between processes of one host)
    #[arg(
        long,
        value_enum,
        default_value = "inproc",
        value_name = "LINK",
        help_heading = "softverbs options"
    )]
    pub link: LinkKind,
    /// Loss recovery of the soft UDP/shm devices the run makes: sr
    /// (selective repeat with peers that offer it too, the default) or gbn
    /// (go-back-N)
    #[arg(
        long,
        value_name = "gbn|sr",
        default_value = "sr",
        value_parser = parse_recovery,
        help_heading = "softverbs options"
    )]
    pub recovery: Recovery,
    /// Test and benchmark facility: the soft UDP link drops this share
    /// (0 to 1) of the datagrams it sends, at random (seeded by the device
    /// name), as a lossy network would
    #[arg(long, hide = true, value_name = "P")]
    pub drop: Option<f64>,
    /// scale: the QP counts to measure, comma separated
    #[arg(
        long,
        value_name = "N,N,…",
        value_delimiter = ',',
        default_value = "1,64,1024,16384",
        help_heading = "softverbs options"
    )]
    pub qp_counts: Vec<u32>,
    /// scale: messages per QP count (spread over the QPs)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1_000_000,
        help_heading = "softverbs options"
    )]
    pub messages: u64,
    /// Print every soft device counter that moved at the end (SIGUSR1
    /// prints them to stderr at any time; drops are said at the end
    /// regardless)
    #[arg(long, help_heading = "softverbs options")]
    pub stats: bool,

    /// Do not warn about CPU frequency scaling (softverbs never does: its
    /// clock is the TSC)
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Print the version and exit
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    /// Fail (exit 3) when the average bandwidth is below this limit, in the
    /// report's unit (MB/sec, Gb/sec with --report_gbits)
    #[arg(short = 'w', long = "limit_bw", value_name = "VALUE")]
    pub limit_bw: Option<f64>,
    /// Fail (exit 3) when the message rate is below this limit, in Mpps
    #[arg(short = 'y', long = "limit_msgrate", value_name = "VALUE")]
    pub limit_msgrate: Option<f64>,
    /// Print only this figure per message size: bandwidth (BW average),
    /// message_rate (Mpps) or latency (t_avg, usec), without banner or
    /// table
    #[arg(long = "output", value_enum, value_name = "UNITS")]
    pub output: Option<OutputKind>,
    /// Reverse the traffic direction: the server's end sends (loopback
    /// runs swap the two devices)
    #[arg(long = "reversed")]
    pub reversed: bool,
    /// Run the test forever (needs -D), printing the results every
    /// duration
    #[arg(long = "run_infinitely", requires = "duration")]
    pub run_infinitely: bool,
    /// Before measuring each size, an unmeasured pass of tx-depth
    /// operations (write, read and atomic bandwidth tests; loopback runs)
    #[arg(long = "perform_warm_up")]
    pub perform_warm_up: bool,

    /// perftest flags that have no effect here (each says why in one line
    /// on standard error).
    #[command(flatten)]
    pub no_effect: NoEffectArgs,
}

/// `--output`: the one figure perftest prints per size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputKind {
    /// Average bandwidth
    #[value(name = "bandwidth")]
    Bandwidth,
    /// Message rate
    #[value(name = "message_rate")]
    MessageRate,
    /// Average latency
    #[value(name = "latency")]
    Latency,
}

/// perftest flags accepted for script compatibility that cannot apply to
/// this implementation: each one given is named on standard error with the
/// reason, and the run goes on without it.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "perftest options without effect here (accepted, said on stderr)")]
pub struct NoEffectArgs {
    /// Report times in CPU cycles
    #[arg(short = 'C', long = "report-cycles")]
    pub report_cycles: bool,
    /// Print every latency sample
    #[arg(short = 'H', long = "report-histogram")]
    pub report_histogram: bool,
    /// Print unsorted latency samples
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Service level
    #[arg(short = 'S', long = "sl", value_name = "SL")]
    pub sl: Option<String>,
    /// Type of service of rdma_cm QPs
    #[arg(short = 'T', long = "tos", value_name = "TOS")]
    pub tos: Option<String>,
    /// Connect QPs with rdma_cm
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Exchange data through rdma_cm
    #[arg(short = 'z', long = "com_rdma_cm")]
    pub com_rdma_cm: bool,
    /// Hop limit (TTL)
    #[arg(short = 'L', long = "hop_limit", value_name = "N")]
    pub hop_limit: Option<String>,
    /// Dual-port mode
    #[arg(short = 'O', long = "dualport")]
    pub dualport: bool,
    /// Performance counters to report
    #[arg(short = 'W', long = "report-counters", value_name = "LIST")]
    pub report_counters: Option<String>,
    /// Completion vector of the event channel
    #[arg(short = 'X', long = "vector", value_name = "N")]
    pub vector: Option<String>,
    /// Multicast group GID
    #[arg(short = 'M', long = "MGID", value_name = "GID")]
    pub mgid: Option<String>,
    /// Send to a multicast group
    #[arg(short = 'g', long = "mcg")]
    pub mcg: bool,
    /// Show CPU utilisation (duration mode)
    #[arg(long = "cpu_util")]
    pub cpu_util: bool,
    /// Use a shared receive queue
    #[arg(long = "use-srq")]
    pub use_srq: bool,
    /// Report RX and TX separately in bidirectional tests
    #[arg(long = "report-both")]
    pub report_both: bool,
    /// Use an IPv6 GID
    #[arg(long = "ipv6")]
    pub ipv6: bool,
    /// Traffic class of the GRH
    #[arg(long = "tclass", value_name = "N")]
    pub tclass: Option<String>,
    /// Destination LID
    #[arg(long = "dlid", value_name = "LID")]
    pub dlid: Option<String>,
    /// Do not exchange versions and MTU
    #[arg(long = "dont_xchg_versions")]
    pub dont_xchg_versions: bool,
    /// Force the link type
    #[arg(long = "force-link", value_name = "TYPE")]
    pub force_link: Option<String>,
    /// Source IP of the connection
    #[arg(long = "source_ip", value_name = "IP")]
    pub source_ip: Option<String>,
    /// Buffer in an mmap'd file
    #[arg(long = "mmap", value_name = "FILE")]
    pub mmap: Option<String>,
    /// Offset in the mmap'd file
    #[arg(long = "mmap-offset", value_name = "OFFSET")]
    pub mmap_offset: Option<String>,
    /// One MR per QP
    #[arg(long = "mr_per_qp")]
    pub mr_per_qp: bool,
    /// On-demand paging
    #[arg(long = "odp")]
    pub odp: bool,
    /// The old post_send flow
    #[arg(long = "use_old_post_send")]
    pub use_old_post_send: bool,
    /// P_Key index
    #[arg(long = "pkey_index", value_name = "N")]
    pub pkey_index: Option<String>,
    /// Report both ports in dual-port mode
    #[arg(long = "report-per-port")]
    pub report_per_port: bool,
    /// Retry count in rdma_cm mode
    #[arg(long = "retry_count", value_name = "N")]
    pub retry_count: Option<String>,
    /// Hugepage buffers
    #[arg(long = "use_hugepages")]
    pub use_hugepages: bool,
    /// Wait before destroying the resources
    #[arg(long = "wait_destroy", value_name = "SECONDS")]
    pub wait_destroy: Option<String>,
    /// Disable PCIe relaxed ordering
    #[arg(long = "disable_pcie_relaxed")]
    pub disable_pcie_relaxed: bool,
    /// Rate limiter burst size
    #[arg(long = "burst_size", value_name = "N")]
    pub burst_size: Option<String>,
    /// Rate limiter packet size
    #[arg(long = "typical_pkt_size", value_name = "BYTES")]
    pub typical_pkt_size: Option<String>,
    /// Rate limit
    #[arg(long = "rate_limit", value_name = "RATE")]
    pub rate_limit: Option<String>,
    /// Rate limit units
    #[arg(long = "rate_units", value_name = "UNITS")]
    pub rate_units: Option<String>,
    /// Rate limiter type
    #[arg(long = "rate_limit_type", value_name = "TYPE")]
    pub rate_limit_type: Option<String>,
    /// Inline receive size
    #[arg(long = "inline_recv", value_name = "SIZE")]
    pub inline_recv: Option<String>,
    /// Gap between latency iterations
    #[arg(long = "latency_gap", value_name = "TIME")]
    pub latency_gap: Option<String>,
    /// Post list of receive WQEs
    #[arg(long = "recv_post_list", value_name = "N")]
    pub recv_post_list: Option<String>,
    /// DC initiator streams
    #[arg(long = "log_dci_streams", value_name = "N")]
    pub log_dci_streams: Option<String>,
    /// Active DC initiator streams
    #[arg(long = "log_active_dci_streams", value_name = "N")]
    pub log_active_dci_streams: Option<String>,
    /// AES-XTS encryption
    #[arg(long = "aes_xts")]
    pub aes_xts: bool,
    /// Encrypt on TX
    #[arg(long = "encrypt_on_tx")]
    pub encrypt_on_tx: bool,
    /// Signature before encryption
    #[arg(long = "sig_before")]
    pub sig_before: bool,
    /// AES block size
    #[arg(long = "aes_block_size", value_name = "SIZE")]
    pub aes_block_size: Option<String>,
    /// Number of data encryption keys
    #[arg(long = "data_enc_keys_number", value_name = "N")]
    pub data_enc_keys_number: Option<String>,
    /// Key encryption key file
    #[arg(long = "kek_path", value_name = "PATH")]
    pub kek_path: Option<String>,
    /// Credentials file
    #[arg(long = "credentials_path", value_name = "PATH")]
    pub credentials_path: Option<String>,
    /// Data encryption key application
    #[arg(long = "data_enc_key_app_path", value_name = "PATH")]
    pub data_enc_key_app_path: Option<String>,
    /// GPU buffers (perftest built with CUDA)
    #[arg(long = "use_cuda", value_name = "GPU")]
    pub use_cuda: Option<String>,
    /// GPU buffers by PCI bus id (perftest built with CUDA)
    #[arg(long = "use_cuda_bus_id", value_name = "BUS_ID")]
    pub use_cuda_bus_id: Option<String>,
    /// GPU buffers (perftest built with ROCm)
    #[arg(long = "use_rocm", value_name = "GPU")]
    pub use_rocm: Option<String>,
}

/// Why the soft path has no mlx5 crypto, DC, rate limiter or device memory
/// features that some perftest flags configure.
const NO_FEATURE: &str = "a feature of some NICs that the verbs API here does not expose";
/// Why the QP attributes below are not applied.
const QP_DEFAULTS: &str = "the QP bring-up uses its defaults (SL 0, hop limit 64, traffic class 0, P_Key index 0)";

impl NoEffectArgs {
    /// One line per given flag: the flag, its value and why it has no
    /// effect.
    pub fn notes(&self) -> Vec<String> {
        let b = |on: bool, flag: &str, why: &str| on.then(|| format!("{flag} ignored: {why}"));
        let v =
            |val: &Option<String>, flag: &str, why: &str| val.as_ref().map(|x| format!("{flag} {x} ignored: {why}"));
        [
            b(self.report_cycles, "-C", "times are reported in usec"),
            b(self.report_histogram, "-H", "the latency table is the summary only"),
            b(self.report_unsorted, "-U", "the latency table is the summary only"),
            v(&self.sl, "-S", QP_DEFAULTS),
            v(&self.tos, "-T", "QPs are connected by the TCP exchange, not rdma_cm"),
            b(self.rdma_cm, "-R", "QPs are connected by the TCP exchange, not rdma_cm"),
            b(
                self.com_rdma_cm,
                "-z",
                "the addresses are exchanged over TCP, not rdma_cm",
            ),
            v(&self.hop_limit, "-L", QP_DEFAULTS),
            b(self.dualport, "-O", "the devices here have one port"),
            v(
                &self.report_counters,
                "-W",
                "use --stats for the soft device's counters",
            ),
            v(&self.vector, "-X", "every CQ uses completion vector 0"),
            v(&self.mgid, "-M", "multicast is not supported (max_mcast_grp 0)"),
            b(self.mcg, "-g", "multicast is not supported (max_mcast_grp 0)"),
            b(self.cpu_util, "--cpu_util", "CPU utilisation is not measured"),
            b(
                self.use_srq,
                "--use-srq",
                "the tests post to each QP's own receive queue",
            ),
            b(
                self.report_both,
                "--report-both",
                "bidirectional runs report the combined figure",
            ),
            b(
                self.ipv6,
                "--ipv6",
                "the GID of -x (or the first populated one) is used as it is",
            ),
            v(&self.tclass, "--tclass", QP_DEFAULTS),
            v(&self.dlid, "--dlid", "RoCE addresses by GID, not LID"),
            b(
                self.dont_xchg_versions,
                "--dont_xchg_versions",
                "the exchange always checks the peer's parameters",
            ),
            v(&self.force_link, "--force-link", "the link layer is the port's"),
            v(
                &self.source_ip,
                "--source_ip",
                "the TCP connection uses the routing table's address",
            ),
            v(&self.mmap, "--mmap", "buffers are allocated memory"),
            v(&self.mmap_offset, "--mmap-offset", "buffers are allocated memory"),
            b(self.mr_per_qp, "--mr_per_qp", "all QPs share one MR"),
            b(self.odp, "--odp", "on-demand paging is not supported"),
            b(self.use_old_post_send, "--use_old_post_send", "there is one post_send"),
            v(&self.pkey_index, "--pkey_index", QP_DEFAULTS),
            b(
                self.report_per_port,
                "--report-per-port",
                "the devices here have one port",
            ),
            v(
                &self.retry_count,
                "--retry_count",
                "QPs are connected by the TCP exchange, not rdma_cm",
            ),
            b(self.use_hugepages, "--use_hugepages", "buffers are allocated memory"),
            v(
                &self.wait_destroy,
                "--wait_destroy",
                "resources are destroyed at the end of the run",
            ),
            b(self.disable_pcie_relaxed, "--disable_pcie_relaxed", NO_FEATURE),
            v(&self.burst_size, "--burst_size", NO_FEATURE),
            v(&self.typical_pkt_size, "--typical_pkt_size", NO_FEATURE),
            v(&self.rate_limit, "--rate_limit", NO_FEATURE),
            v(&self.rate_units, "--rate_units", NO_FEATURE),
            v(&self.rate_limit_type, "--rate_limit_type", NO_FEATURE),
            v(&self.inline_recv, "--inline_recv", NO_FEATURE),
            v(
                &self.latency_gap,
                "--latency_gap",
                "latency iterations run back to back",
            ),
            v(
                &self.recv_post_list,
                "--recv_post_list",
                "receives are posted one at a time",
            ),
            v(&self.log_dci_streams, "--log_dci_streams", NO_FEATURE),
            v(&self.log_active_dci_streams, "--log_active_dci_streams", NO_FEATURE),
            b(self.aes_xts, "--aes_xts", NO_FEATURE),
            b(self.encrypt_on_tx, "--encrypt_on_tx", NO_FEATURE),
            b(self.sig_before, "--sig_before", NO_FEATURE),
            v(&self.aes_block_size, "--aes_block_size", NO_FEATURE),
            v(&self.data_enc_keys_number, "--data_enc_keys_number", NO_FEATURE),
            v(&self.kek_path, "--kek_path", NO_FEATURE),
            v(&self.credentials_path, "--credentials_path", NO_FEATURE),
            v(&self.data_enc_key_app_path, "--data_enc_key_app_path", NO_FEATURE),
            v(&self.use_cuda, "--use_cuda", "buffers are host memory (no GPU support)"),
            v(
                &self.use_cuda_bus_id,
                "--use_cuda_bus_id",
                "buffers are host memory (no GPU support)",
            ),
            v(&self.use_rocm, "--use_rocm", "buffers are host memory (no GPU support)"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// For the perf modules' tests: arguments as `softverbs perf` parses them.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use clap::Parser;
    use softverbs::verbs::BackendKind;

    use crate::cli::perftest::PerfError;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    /// `softverbs perf ARGS` as parsed, or clap's error.
    pub(crate) fn try_parse(args: &[&str]) -> Result<PerfArgs, clap::Error> {
        let mut v = vec!["perf"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| c.perf)
    }

    /// The parameters of `softverbs perf ARGS` on the soft backend.
    pub(crate) fn params(args: &[&str]) -> Result<Params, PerfError> {
        Params::from_args(&try_parse(args).expect("parse"), BackendKind::Soft)
    }
}
