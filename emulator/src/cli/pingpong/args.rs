//! The command line of `softverbs pingpong`: its flags ([`Args`]), the
//! values of its options, and the `ibv_rc_pingpong` flags it accepts
//! without effect ([`NoEffectArgs`]).

use std::net::IpAddr;

use clap::ValueEnum;
use softverbs::soft::proto::Recovery;

/// Arguments of `softverbs pingpong`.
#[derive(Debug, Clone, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// Server to connect to (client mode); without it, wait for a client
    pub server: Option<String>,
    /// TCP port of the out-of-band exchange
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Use this existing device instead of creating a soft UDP device
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,
    /// Use port PORT of the device
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// Local port GID index (a soft device's GID 0 is its address)
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_index: u8,
    /// Message size in bytes
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096)
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: u32,
    /// Number of exchanges (measured)
    #[arg(short = 'n', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Unmeasured iterations before the measured ones (send only)
    #[arg(long, default_value_t = 100)]
    pub warmup: u32,
    /// Sleep on CQ events (completion channel) instead of busy-polling
    #[arg(short = 'e', long)]
    pub events: bool,
    /// What to measure
    #[arg(long, value_enum, default_value_t = Op::Send)]
    pub op: Op,
    /// Signaled sends (--op send) or RDMA WRITEs (--op write) in flight
    #[arg(long = "tx-depth", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tx_depth: u32,
    /// Validate every received buffer (--op send; --op write always
    /// checks the written data)
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Local address of the UDP device [default: the address of the TCP
    /// connection]
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// UDP port of the device [default: 4791 if free, else a private one]
    #[arg(long = "udp-port", value_name = "PORT")]
    pub udp_port: Option<u16>,
    /// How the soft engine makes progress
    #[arg(long, value_enum, default_value_t = Engine::Inline)]
    pub engine: Engine,
    /// Busy-poll time of the progress thread before it sleeps, in µs
    #[arg(long = "spin-us", default_value_t = 50)]
    pub spin_us: u64,
    /// UDP GSO policy of the soft device
    #[arg(long, value_enum, default_value_t = Gso::Auto)]
    pub gso: Gso,
    /// Whether the soft device may send to its peer by a connected socket
    /// (auto: towards soft devices and IPv6 peers; over IPv4 the kernel
    /// then numbers the IP id, which the ICRC assumes is 0: off for
    /// captures whose ICRCs must check)
    #[arg(long, value_enum, default_value_t = Connected::Auto)]
    pub connected: Connected,
    /// Which path the soft device uses to reach the peer: shared memory
    /// when the peer is a soft device on this host (else UDP), shared
    /// memory only, or UDP only
    #[arg(long, value_enum, default_value_t = LinkKind::Udp)]
    pub link: LinkKind,
    /// Seconds the client keeps retrying to reach the server
    #[arg(long = "connect-timeout", default_value_t = 10)]
    pub connect_timeout: u64,
    /// Print the soft device's counters at the end (SIGUSR1 prints them
    /// to stderr at any time; drops are said at the end regardless)
    #[arg(long)]
    pub stats: bool,
    /// Local ACK timeout of the QP, as in `ibv_modify_qp`: 4.096 µs ·
    /// 2^N per try (14: 67 ms), 0 for none. With `retry_cnt` 7 the run
    /// fails with `RETRY_EXC_ERR` once the peer has not answered for 8
    /// tries, so on a loaded host (where a busy-polling peer can wait
    /// half a second for a CPU) a larger value keeps a slow peer from
    /// counting as a dead one
    #[arg(long = "qp-timeout", value_name = "N", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Loss recovery of the soft device: sr (selective repeat with peers
    /// that offer it too, the default) or gbn (go-back-N)
    #[arg(long, value_name = "gbn|sr", default_value = "sr", value_parser = parse_recovery)]
    pub recovery: Recovery,
    /// Test facility: the UDP link drops this share (0 to 1) of the
    /// datagrams it sends, at random, as a lossy network would
    #[arg(long, hide = true, value_name = "P")]
    pub drop: Option<f64>,
    /// ibv_rc_pingpong's flags that have no effect here (each is said on
    /// standard error); last, as their help heading applies to what
    /// follows.
    #[command(flatten)]
    pub no_effect: NoEffectArgs,
}

/// `ibv_rc_pingpong` flags accepted for compatibility that cannot apply
/// here.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "ibv_rc_pingpong options without effect here (accepted, said on stderr)")]
pub struct NoEffectArgs {
    /// Service level
    #[arg(short = 'l', long = "sl", value_name = "SL")]
    pub sl: Option<u8>,
    /// Use on-demand paging
    #[arg(short = 'o', long = "odp")]
    pub odp: bool,
    /// Use implicit on-demand paging
    #[arg(short = 'O', long = "iodp")]
    pub iodp: bool,
    /// Prefetch an ODP MR
    #[arg(short = 'P', long = "prefetch")]
    pub prefetch: bool,
    /// Get CQEs with timestamps
    #[arg(short = 't', long = "ts")]
    pub ts: bool,
    /// Use device memory
    #[arg(short = 'j', long = "dm")]
    pub dm: bool,
    /// Use the new post send WR API
    #[arg(short = 'N', long = "new_send")]
    pub new_send: bool,
}

impl NoEffectArgs {
    /// One line per given flag and why it has no effect.
    pub fn notes(&self) -> Vec<String> {
        let odp = "on-demand paging is not supported (MRs are pinned allocations)";
        [
            self.sl.map(|sl| format!("-l {sl} ignored: the QP bring-up uses SL 0")),
            self.odp.then(|| format!("-o ignored: {odp}")),
            self.iodp.then(|| format!("-O ignored: {odp}")),
            self.prefetch.then(|| format!("-P ignored: {odp}")),
            self.ts.then(|| {
                "-t ignored: completions carry no timestamps here (completion_timestamp_mask not supported)".to_string()
            }),
            self.dm.then(|| "-j ignored: there is no device memory".to_string()),
            self.new_send
                .then(|| "-N ignored: sends are posted with post_send (the same work requests)".to_string()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// What `pingpong` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// RC send/receive ping-pong (latency and bandwidth)
    Send,
    /// One-way RDMA WRITE stream (bandwidth; the server stays passive)
    Write,
}

/// `--engine` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// Posting and polling drive the engine (no extra thread)
    Inline,
    /// A progress thread per device
    Thread,
}

/// `--link` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LinkKind {
    /// Shared memory to soft devices on this host, UDP otherwise
    Auto,
    /// Shared memory only
    Shm,
    /// UDP only
    Udp,
}

/// `--connected` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Connected {
    /// Towards soft devices (loopback, private GIDs) and IPv6 peers
    Auto,
    /// Never
    Off,
}

/// `--gso` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Gso {
    /// Towards loopback and private-GID peers only
    Auto,
    /// Whenever the kernel has it
    On,
    /// Never
    Off,
}

fn parse_recovery(s: &str) -> Result<Recovery, String> {
    match s {
        "gbn" => Ok(Recovery::GoBackN),
        "sr" => Ok(Recovery::SelectiveRepeat),
        _ => Err(format!("unknown recovery {s:?} (gbn or sr)")),
    }
}
