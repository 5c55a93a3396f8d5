//! The parameters of a run, resolved from the command line ([`PerfArgs`])
//! with perftest's defaults per test, and checked: the combinations
//! perftest refuses are usage errors, and flags that change nothing here
//! or are adjusted say so in [`Params::notes`].

use clap::ValueEnum as _;

use softverbs::soft::proto::Recovery;
use softverbs::verbs::{BackendKind, Mtu};

use super::args::{AtomicType, Connection, LinkKind, OutputKind, PerfArgs, PerfTest, VerbKind};
use super::PerfError;

/// Where the two ends of the test run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Both ends in this process.
    Loopback,
    /// Wait for a client on the TCP port.
    Server,
    /// Connect to a server.
    Client(String),
}

/// Everything a run needs, resolved from [`PerfArgs`] with perftest's
/// defaults and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The test.
    pub test: PerfTest,
    /// Its verb.
    pub verb: VerbKind,
    /// Bandwidth (true) or latency test.
    pub bw: bool,
    /// Message sizes to run, in order.
    pub sizes: Vec<u64>,
    /// Iterations per QP (ignored with `duration`).
    pub iters: u64,
    /// `-D`: seconds.
    pub duration: Option<u64>,
    /// `-f`: seconds of warm-up and cool-down in a `-D` run.
    pub margin: f64,
    /// Send queue depth per QP.
    pub tx_depth: u32,
    /// `-u`: local ACK timeout of RC QPs (IBTA exponent).
    pub qp_timeout: u8,
    /// Receive queue depth per QP.
    pub rx_depth: u32,
    /// CQ moderation.
    pub cq_mod: u32,
    /// Inline threshold.
    pub inline_size: u32,
    /// Transport.
    pub connection: Connection,
    /// Number of QPs.
    pub qps: u32,
    /// Bidirectional.
    pub duplex: bool,
    /// Requested path MTU (`None`: the port's active MTU).
    pub mtu: Option<Mtu>,
    /// Post list length.
    pub post_list: u32,
    /// Sleep on completion events.
    pub events: bool,
    /// `--heap`: buffers from the process heap.
    pub heap: bool,
    /// Atomic operation.
    pub atomic_type: AtomicType,
    /// Outstanding reads/atomics requested (`None`: device maximum, ≤ 16).
    pub outs: Option<u32>,
    /// Compute the peak bandwidth.
    pub peak: bool,
    /// Report Gb/s.
    pub report_gbits: bool,
    /// Decimal places of the latency figures.
    pub digits: usize,
    /// Blocks of the in-run A/B switch (`--ab`).
    pub ab: Option<u64>,
    /// JSON report file.
    pub out_json: Option<String>,
    /// Device.
    pub ib_dev: Option<String>,
    /// Loopback peer device.
    pub peer_dev: Option<String>,
    /// Port.
    pub ib_port: u8,
    /// GID index.
    pub gid_index: Option<u8>,
    /// TCP port.
    pub tcp_port: u16,
    /// Where the ends run.
    pub mode: Mode,
    /// Backend.
    pub backend: BackendKind,
    /// Link (soft backend).
    pub link: LinkKind,
    /// Loss recovery of the soft devices the run makes (`--recovery`).
    pub recovery: Recovery,
    /// `--drop`: share of the datagrams the soft UDP link drops.
    pub drop: Option<f64>,
    /// `--output`: print only this figure per size.
    pub output: Option<OutputKind>,
    /// `-w`: least average bandwidth, in the report's unit.
    pub limit_bw: Option<f64>,
    /// `-y`: least message rate, in Mpps.
    pub limit_msgrate: Option<f64>,
    /// `--reversed`: the server's end sends.
    pub reversed: bool,
    /// `--perform_warm_up`: an unmeasured pass before each size.
    pub warm_up: bool,
    /// Values the run uses other than the ones given (a margin too long
    /// for the duration, a moderation the test cannot use, …), and the
    /// flags without effect: one line each, for standard error.
    pub notes: Vec<String>,
}

/// perftest's largest message (`-a` goes up to it).
pub const MAX_SIZE: u64 = 1 << 23;
/// perftest's minimum iteration count.
pub const MIN_ITERS: u64 = 5;
/// Above this many iterations perftest stops computing the peak.
pub const PEAK_MAX_ITERS: u64 = 20_000;

fn usage(msg: impl Into<String>) -> PerfError {
    PerfError::Usage(msg.into())
}

impl Params {
    /// Resolves the arguments of a perftest test (not `scale`).
    ///
    /// # Errors
    ///
    /// [`PerfError::Usage`] for a combination perftest rejects (a verb the
    /// connection type cannot carry, a size out of range, a server or
    /// client on the in-process link, …).
    pub fn from_args(a: &PerfArgs, backend: BackendKind) -> Result<Params, PerfError> {
        let verb = a
            .test
            .verb()
            .ok_or_else(|| usage("the scale test is not a perftest test"))?;
        let bw = a.test.is_bw();
        let ud = a.connection == Connection::Ud;
        match (verb, a.connection) {
            (VerbKind::Send, _) | (VerbKind::Write, Connection::Rc | Connection::Uc) => {}
            (VerbKind::Read | VerbKind::Atomic, Connection::Rc) => {}
            (v, c) => {
                return Err(usage(format!(
                    "{} is not supported on {} (perftest: reads and atomics need RC, writes RC or UC; UD carries sends only)",
                    v.perftest_name(),
                    c.name()
                )))
            }
        }
        let mode = match (&a.client, &a.host, a.server) {
            (Some(h), _, _) | (None, Some(h), _) => Mode::Client(h.clone()),
            (None, None, true) => Mode::Server,
            (None, None, false) => Mode::Loopback,
        };
        if backend == BackendKind::Soft {
            match a.link {
                LinkKind::Inproc if mode != Mode::Loopback => {
                    return Err(PerfError::Usage(
                        "--server/--client need a network link between processes: use --link udp (the in-process \
                         link joins devices of one process only), or --backend hw over real devices"
                            .into(),
                    ))
                }
                LinkKind::Inproc | LinkKind::Udp | LinkKind::Shm => {}
            }
        }
        let atomic = verb == VerbKind::Atomic;
        let default_size = if atomic {
            8
        } else if bw {
            65536
        } else {
            2
        };
        let size = a.size.unwrap_or(default_size);
        if atomic && size != 8 {
            return Err(usage("atomic tests use 8-byte messages (-s 8)"));
        }
        if !(1..=MAX_SIZE).contains(&size) {
            return Err(usage(format!("size {size} out of range 1..={MAX_SIZE}")));
        }
        let mtu = match a.mtu {
            None => None,
            Some(m) => Some(
                Mtu::ALL
                    .iter()
                    .copied()
                    .find(|x| x.bytes() == m)
                    .ok_or_else(|| usage(format!("MTU {m}: must be 256, 512, 1024, 2048 or 4096")))?,
            ),
        };
        let sizes = if a.all && !atomic {
            (1..=23).map(|e| 1u64 << e).collect()
        } else {
            vec![size]
        };
        let iters = a.iters.unwrap_or(if bw { 5000 } else { 1000 });
        if iters < MIN_ITERS {
            return Err(usage(format!("iterations must be at least {MIN_ITERS}")));
        }
        let mut notes = Vec::new();
        if a.all && atomic {
            notes.push("-a: atomic tests run 8-byte messages only".to_string());
        }
        // The parser refuses depths and moderation of 0.
        let tx_depth = a.tx_depth.unwrap_or(if bw { 128 } else { 1 });
        let rx_depth = a.rx_depth.unwrap_or(if verb == VerbKind::Send { 512 } else { 1 });
        let mut cq_mod = a.cq_mod.unwrap_or(100);
        if a.post_list > 1 {
            // perftest signals the last WR of each list.
            if a.cq_mod.is_some_and(|q| q != a.post_list) {
                notes.push(format!(
                    "-Q {cq_mod} replaced by {}: with a post list the last WR of each list is signaled",
                    a.post_list
                ));
            }
            cq_mod = a.post_list;
            if a.post_list > tx_depth {
                return Err(usage(format!(
                    "post list {} is longer than the tx depth {tx_depth}",
                    a.post_list
                )));
            }
            if a.duration.is_none() && !iters.is_multiple_of(u64::from(a.post_list)) {
                return Err(usage(format!(
                    "iterations ({iters}) must be a multiple of the post list ({})",
                    a.post_list
                )));
            }
        }
        if bw {
            if cq_mod > tx_depth {
                if a.cq_mod.is_some() {
                    notes.push(format!(
                        "-Q {cq_mod} lowered to the tx depth {tx_depth} (a CQE at least once per queue)"
                    ));
                }
                cq_mod = tx_depth;
            }
        } else if verb != VerbKind::Send {
            // perftest's write, read and atomic latency tests signal every
            // WR; send_lat signals every cq_mod-th and the last, and waits
            // for that completion before going on.
            if a.cq_mod.is_some_and(|q| q != 1) {
                notes.push(format!("-Q {cq_mod} ignored: {} signals every WR", a.test));
            }
            cq_mod = 1;
        }
        let inline_size = a.inline_size.unwrap_or(match (bw, verb) {
            (false, VerbKind::Write) => 220,
            (false, VerbKind::Send) if ud => 188,
            (false, VerbKind::Send) => 236,
            _ => 0,
        });
        if a.bidirectional && !bw {
            return Err(usage("-b (bidirectional) is for bandwidth tests"));
        }
        if a.events && a.duration.is_some() {
            return Err(usage("-e (events) cannot be combined with -D"));
        }
        if a.events && a.test == PerfTest::WriteLat {
            // The answer is the peer's WRITE into memory: no completion to
            // sleep for.
            return Err(usage(
                "-e (events) is not for write_lat: its answers raise no completion",
            ));
        }
        let out_json = a.out_json_file.clone().or_else(|| a.out_json.clone());
        // The parser refuses -D 0.
        let duration = a.duration;
        let mut margin = a.margin as f64;
        if let Some(d) = duration {
            // Keep at least half of the run for sampling.
            if 2.0 * margin > d as f64 / 2.0 {
                margin = d as f64 / 4.0;
                notes.push(format!(
                    "-f {}: margin lowered to {margin} s so that half of the {d} s run is sampled",
                    a.margin
                ));
            }
        }
        if a.reversed && mode != Mode::Loopback {
            return Err(usage(
                "--reversed is implemented for loopback runs (both ends here): swap the roles of the two hosts instead",
            ));
        }
        if let Some(o) = a.output {
            let fits = match o {
                OutputKind::Bandwidth | OutputKind::MessageRate => bw,
                OutputKind::Latency => !bw,
            };
            if !fits {
                return Err(usage(format!(
                    "--output {}: not a figure of {}",
                    o.to_possible_value()
                        .map_or_else(String::new, |v| v.get_name().to_string()),
                    a.test
                )));
            }
        }
        // A loopback run over the soft UDP or shared-memory link makes its
        // two devices for their roles (the passive one with a progress
        // thread): swapping them would leave the passive end undriven.
        let net_loopback = backend == BackendKind::Soft && a.link != LinkKind::Inproc;
        let reversed = a.reversed && !net_loopback;
        if a.reversed && net_loopback {
            notes.push(format!(
                "--reversed ignored: over --link {} both loopback devices are made for their roles, alike but for that",
                a.link.name()
            ));
        }
        if let Some(d) = a.drop {
            if !(0.0..=1.0).contains(&d) {
                return Err(usage(format!("--drop {d}: a probability, from 0 to 1")));
            }
        }
        let drop = a
            .drop
            .filter(|_| backend == BackendKind::Soft && a.link == LinkKind::Udp);
        if a.drop.is_some() && drop.is_none() {
            notes.push("--drop ignored: only the soft backend's UDP link (--link udp) injects loss".to_string());
        }
        if a.recovery != Recovery::default() && !net_loopback {
            notes.push(
                "--recovery ignored: it sets the soft UDP/shm devices a run makes (--link udp or shm), not existing \
                 devices"
                    .to_string(),
            );
        }
        let warm_up = a.perform_warm_up && bw && verb != VerbKind::Send && mode == Mode::Loopback;
        if a.perform_warm_up && !warm_up {
            notes.push(if mode == Mode::Loopback {
                "--perform_warm_up ignored: as in perftest, only write, read and atomic bandwidth tests warm up"
                    .to_string()
            } else {
                "--perform_warm_up ignored: server/client runs do not warm up here (loopback runs do)".to_string()
            });
        }
        notes.extend(a.no_effect.notes());
        Ok(Params {
            test: a.test,
            verb,
            bw,
            sizes,
            iters,
            duration,
            margin,
            tx_depth,
            qp_timeout: a.qp_timeout,
            rx_depth,
            cq_mod,
            inline_size,
            connection: a.connection,
            qps: a.qps,
            duplex: a.bidirectional,
            mtu,
            post_list: a.post_list,
            events: a.events,
            heap: a.heap,
            atomic_type: a.atomic_type,
            outs: a.outs,
            peak: !a.no_peak && iters <= PEAK_MAX_ITERS && duration.is_none(),
            report_gbits: a.report_gbits,
            digits: usize::from(a.digits),
            ab: a.ab,
            out_json,
            ib_dev: a.ib_dev.clone(),
            peer_dev: a.peer_dev.clone(),
            ib_port: a.ib_port,
            gid_index: a.gid_index,
            tcp_port: a.port,
            mode,
            backend,
            link: a.link,
            recovery: a.recovery,
            drop,
            output: a.output,
            limit_bw: a.limit_bw,
            limit_msgrate: a.limit_msgrate,
            reversed,
            warm_up,
            notes,
        })
    }

    /// The parameters of a `--perform_warm_up` pass: the tx depth's worth
    /// of operations per QP (at least perftest's minimum, a whole number of
    /// post lists), one way, nothing measured.
    pub fn warm_up_params(&self) -> Params {
        let l = u64::from(self.post_list);
        let iters = u64::from(self.tx_depth).max(MIN_ITERS).div_ceil(l) * l;
        Params {
            iters,
            duration: None,
            peak: false,
            duplex: false,
            warm_up: false,
            ..self.clone()
        }
    }

    /// The largest message of the run.
    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(1)
    }

    /// Whether the send side of the test uses inline data for `size`.
    pub fn inline_for(&self, size: u64) -> bool {
        matches!(self.verb, VerbKind::Write | VerbKind::Send) && size <= u64::from(self.inline_size)
    }
}

#[cfg(test)]
mod tests;
