//! What `softverbs perf <test>` does: pick the devices, build both ends (in
//! this process with `--loopback`, or this end and a TCP exchange with
//! `--server`/`--client`), print the banner and the address lines, run
//! every message size and print its row, and write the JSON report.

use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;

use softverbs::verbs::{self, Device, WorkCompletion};

use super::args::{LinkKind, Mode, Params, PerfArgs, PerfTest, VerbKind};
use super::bw::{BwReceiver, BwSender};
use super::exchange::{done_line, parse_done, PeerLink};
use super::lat::{LatAgent, LatOutcome};
use super::report::{self, BannerInfo, Row, RESULT_LINE};
use super::resources::{Dest, Side};
use super::stats::BwResult;
use super::{drive, Agent, Clock, PerfError, Progress, Step, VerbsContext, STALL_TIMEOUT};

/// Runs `softverbs perf` with `args` on `backend`, writing the report to
/// `out`; returns the result rows (one per message size; none for
/// `scale`).
///
/// # Errors
///
/// See [`PerfError`].
pub fn run(args: &PerfArgs, backend: verbs::BackendKind, out: &mut dyn Write) -> Result<Vec<Row>, PerfError> {
    if args.test == PerfTest::Scale {
        return crate::cli::perftest::scale::run(args, backend, out).map(|()| Vec::new());
    }
    let p = Params::from_args(args, backend)?;
    let net = p.backend == verbs::BackendKind::Soft && matches!(p.link, LinkKind::Udp | LinkKind::Shm);
    let shm = p.link == LinkKind::Shm;
    match p.mode.clone() {
        Mode::Loopback => run_loopback_on(&p, out),
        Mode::Server => {
            let dev = if net { None } else { Some(device(&p)?) };
            writeln!(out, "\n************************************")?;
            writeln!(out, "* Waiting for client to connect... *")?;
            writeln!(out, "************************************")?;
            out.flush()?;
            let link = PeerLink::listen(p.tcp_port, &p)?;
            let dev = match dev {
                Some(d) => d,
                None => udp_device("perf_udp_server", link.local_ip()?, shm, NetOpts::of(&p))?,
            };
            run_networked(&p, &dev, link, true, out)
        }
        Mode::Client(host) => {
            let dev = if net { None } else { Some(device(&p)?) };
            let link = PeerLink::connect(&host, p.tcp_port)?;
            let dev = match dev {
                Some(d) => d,
                None => udp_device("perf_udp_client", link.local_ip()?, shm, NetOpts::of(&p))?,
            };
            run_networked(&p, &dev, link, false, out)
        }
    }
}

/// Runs a loopback test (both ends in this process) on `backend` and
/// returns its rows (one per message size) besides writing the report to
/// `out`: what `softverbs perf --backends` puts side by side.
///
/// # Errors
///
/// [`PerfError::Usage`] for `scale` or a server/client mode (a comparison
/// runs both ends here); otherwise see [`PerfError`].
pub fn run_rows(args: &PerfArgs, backend: verbs::BackendKind, out: &mut dyn Write) -> Result<Vec<Row>, PerfError> {
    if args.test == PerfTest::Scale {
        return Err(PerfError::Usage(
            "the scale test has no per-size rows to compare".to_string(),
        ));
    }
    let p = Params::from_args(args, backend)?;
    if p.mode != Mode::Loopback {
        return Err(PerfError::Usage(
            "a comparison of backends runs both ends in this process: drop --server/--client".to_string(),
        ));
    }
    run_loopback_on(&p, out)
}

/// The loopback devices of `p` (UDP or shared memory for a networked soft
/// link, else the backend's devices), then [`run_loopback`].
fn run_loopback_on(p: &Params, out: &mut dyn Write) -> Result<Vec<Row>, PerfError> {
    let net = p.backend == verbs::BackendKind::Soft && matches!(p.link, LinkKind::Udp | LinkKind::Shm);
    let (a, b) = if net {
        udp_loopback_devices(p.bw, p.verb, p.link == LinkKind::Shm, NetOpts::of(p))?
    } else {
        loopback_devices(p)?
    };
    if p.reversed {
        // --reversed: the server's device sends.
        return run_loopback(p, &b, &a, out);
    }
    run_loopback(p, &a, &b, out)
}

/// What a run sets on the soft devices it makes: `--recovery`, `--drop`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetOpts {
    /// Loss recovery offered to peers.
    pub recovery: softverbs::soft::proto::Recovery,
    /// Share of the datagrams the UDP link drops (a test facility).
    pub drop: Option<f64>,
}

impl NetOpts {
    /// The options of `p`.
    pub fn of(p: &Params) -> NetOpts {
        NetOpts {
            recovery: p.recovery,
            drop: p.drop,
        }
    }
}

/// A soft device on the UDP link bound to `ip` (automatic port; the
/// private GID carries it), created once per process and name; with `shm`,
/// shared-memory rings carry the traffic and UDP only the rendezvous.
fn udp_device(name: &str, ip: std::net::IpAddr, shm: bool, opts: NetOpts) -> Result<Device, PerfError> {
    udp_device_with(name, ip, softverbs::soft::engine::EngineMode::Inline, shm, opts)
}

fn udp_device_with(
    name: &str,
    ip: std::net::IpAddr,
    engine: softverbs::soft::engine::EngineMode,
    shm: bool,
    opts: NetOpts,
) -> Result<Device, PerfError> {
    let name = &format!("{name}{}", if shm { "_shm" } else { "" });
    use softverbs::soft::link::udp::UdpConfig;
    use softverbs::soft::{SoftDevice, SoftDeviceConfig};
    if let Some(d) = verbs::devices(Some(verbs::BackendKind::Soft))
        .ok()
        .and_then(|ds| ds.into_iter().find(|d| d.name() == name))
    {
        return Ok(d);
    }
    let mut udp = UdpConfig::new(ip);
    if let Some(d) = opts.drop {
        // Seeded by the name: each device its own draws, the same in
        // every run.
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        udp.drop =
            Some(softverbs::soft::link::udp::InjectedLoss::new(d, seed).map_err(|e| PerfError::Usage(e.to_string()))?);
    }
    let cfg = if shm {
        SoftDeviceConfig::udp_shm(name, udp, softverbs::soft::link::shm::ShmMode::Only)
    } else {
        SoftDeviceConfig::udp(name, udp)
    };
    let mut cfg = cfg.map_err(|e| PerfError::NotAvailable(format!("soft device on {ip}: {e}")))?;
    cfg.engine = engine;
    cfg.recovery = opts.recovery;
    let dev = SoftDevice::create(cfg).map_err(|e| PerfError::NotAvailable(format!("UDP soft device: {e}")))?;
    Ok(dev.device())
}

/// The two devices of a loopback run over the UDP link: two soft devices
/// on 127.0.0.1, each with its own port, talking RoCEv2 through the kernel.
/// The measuring thread polls CQs, which drives inline devices. A side
/// nobody polls needs a progress thread that sleeps on its socket (spin 0:
/// on a small machine a second spinning thread would steal the measuring
/// thread's core): the passive side of a bandwidth test or of a one-sided
/// operation (read, atomic, write), and both sides of write_lat, which polls
/// memory rather than a CQ (as perftest does).
///
/// # Errors
///
/// [`PerfError::NotAvailable`] when the sockets cannot be bound.
pub fn udp_loopback_devices(bw: bool, verb: VerbKind, shm: bool, opts: NetOpts) -> Result<(Device, Device), PerfError> {
    use softverbs::soft::engine::EngineMode;
    let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let threaded = EngineMode::ProgressThread {
        spin: std::time::Duration::ZERO,
    };
    let a = if verb == VerbKind::Write && !bw {
        udp_device_with("perf_udp_0t", lo, threaded, shm, opts)?
    } else {
        udp_device("perf_udp_0", lo, shm, opts)?
    };
    let b = if bw || verb != VerbKind::Send {
        udp_device_with("perf_udp_1t", lo, threaded, shm, opts)?
    } else {
        udp_device("perf_udp_1", lo, shm, opts)?
    };
    Ok((a, b))
}

fn all_devices(p: &Params) -> Result<Vec<Device>, PerfError> {
    let devs = verbs::devices(Some(p.backend)).map_err(|e| PerfError::NotAvailable(e.to_string()))?;
    if devs.is_empty() {
        return Err(PerfError::NotAvailable(format!(
            "no RDMA device for the {} backend",
            p.backend
        )));
    }
    Ok(devs)
}

fn find(devs: &[Device], name: &str) -> Result<Device, PerfError> {
    devs.iter().find(|d| d.name() == name).cloned().ok_or_else(|| {
        let names: Vec<&str> = devs.iter().map(Device::name).collect();
        PerfError::NotAvailable(format!("no RDMA device named '{name}' (found: {})", names.join(", ")))
    })
}

/// The device of this end: `-d`, or the first device of the backend.
///
/// # Errors
///
/// [`PerfError::NotAvailable`] when there is no such device.
pub fn device(p: &Params) -> Result<Device, PerfError> {
    let devs = all_devices(p)?;
    match &p.ib_dev {
        Some(n) => find(&devs, n),
        None => Ok(devs[0].clone()),
    }
}

/// The two devices of a loopback run: `-d` (default: the first) and
/// `--peer-dev` (default: the next device of the soft backend, the same
/// device otherwise).
///
/// # Errors
///
/// [`PerfError::NotAvailable`] when a device is missing.
pub fn loopback_devices(p: &Params) -> Result<(Device, Device), PerfError> {
    let devs = all_devices(p)?;
    let a = match &p.ib_dev {
        Some(n) => find(&devs, n)?,
        None => devs[0].clone(),
    };
    let b = match &p.peer_dev {
        Some(n) => find(&devs, n)?,
        None if p.backend == verbs::BackendKind::Soft => devs
            .iter()
            .find(|d| d.name() != a.name())
            .cloned()
            .unwrap_or_else(|| a.clone()),
        None => a.clone(),
    };
    Ok((a, b))
}

fn banner_info<'a>(p: &'a Params, side: &'a Side, placement: String, client: bool) -> BannerInfo<'a> {
    // What the device grants below the request is said, not clamped
    // silently.
    if side.inline_size < p.inline_size {
        eprintln!(
            "softverbs: perf {}: inline size {} lowered to the device's max_inline_data {}",
            p.test, p.inline_size, side.inline_size
        );
    }
    if let Some(o) = p
        .outs
        .filter(|&o| o > side.out_reads && matches!(p.verb, VerbKind::Read | VerbKind::Atomic))
    {
        eprintln!(
            "softverbs: perf {}: -o {o} lowered to {} (the device's max_qp_rd_atom, at most 16)",
            p.test, side.out_reads
        );
    }
    BannerInfo {
        params: p,
        device: &side.dev_name,
        mtu: side.mtu.bytes(),
        link_layer: side.link_layer,
        gid_index: side.gid_index,
        inline_size: side.inline_size,
        out_reads: side.out_reads,
        backend: match p.backend {
            verbs::BackendKind::Soft => "soft",
            verbs::BackendKind::Hardware => "hw",
        },
        placement,
        client,
    }
}

fn print_addresses(out: &mut dyn Write, p: &Params, local: &[Dest], remote: &[Dest]) -> Result<(), PerfError> {
    if p.output.is_some() {
        return Ok(());
    }
    for d in local {
        out.write_all(report::address_lines("local", d, p.verb, p.connection).as_bytes())?;
    }
    for d in remote {
        out.write_all(report::address_lines("remote", d, p.verb, p.connection).as_bytes())?;
    }
    writeln!(out, "{RESULT_LINE}")?;
    Ok(())
}

fn header(p: &Params) -> String {
    if p.output.is_some() {
        String::new()
    } else if p.bw {
        report::bw_header(p.report_gbits)
    } else {
        report::lat_header(p.duration.is_some())
    }
}

fn row_text(p: &Params, r: &Row) -> String {
    if let Some(o) = p.output {
        return report::output_value(r, o, p.report_gbits);
    }
    match r {
        Row::Bw(b) => report::bw_row(b, p.report_gbits),
        Row::Lat(l) => report::lat_row(l, p.digits),
        Row::LatDur(l) => report::lat_dur_row(l, p.digits),
    }
}

fn lat_row(o: Option<LatOutcome>) -> Option<Row> {
    o.map(|o| match o {
        LatOutcome::Iters(l) => Row::Lat(l),
        LatOutcome::Duration(d) => Row::LatDur(d),
    })
}

fn write_json(p: &Params, info: &BannerInfo<'_>, rows: &[Row]) -> Result<(), PerfError> {
    if let Some(path) = &p.out_json {
        std::fs::write(path, report::json(info, rows))
            .map_err(|e| PerfError::Failed(format!("writing the JSON report {path}: {e}")))?;
    }
    Ok(())
}

/// Runs both ends in this process: `a` is the client (sender), `b` the
/// server.
///
/// # Errors
///
/// See [`PerfError`].
pub fn run_loopback(p: &Params, a: &Device, b: &Device, out: &mut dyn Write) -> Result<Vec<Row>, PerfError> {
    let ctx_a = a.open().ctx(&format!("opening {}", a.name()))?;
    let ctx_b = b.open().ctx(&format!("opening {}", b.name()))?;
    let mut sa = Side::new(&ctx_a, p, p.max_size(), 1)?;
    let mut sb = Side::new(&ctx_b, p, p.max_size(), 2)?;
    let (da, db) = (sa.dests(), sb.dests());
    sa.connect(&db)?;
    sb.connect(&da)?;
    let placement = format!("loopback, {} <-> {} in this process", a.name(), b.name());
    let info = banner_info(p, &sa, placement, true);
    if p.output.is_none() {
        out.write_all(report::banner(&info).as_bytes())?;
    }
    print_addresses(out, p, &da, &db)?;
    out.write_all(header(p).as_bytes())?;
    out.flush()?;
    let mut rows = Vec::new();
    let mut progress = Progress::new(p.test.name());
    for &size in &p.sizes {
        progress.restart(format!("{} {size} B", p.test));
        let row = loopback_size(p, &sa, &sb, &da, &db, size, &mut progress)?;
        progress.clear();
        if let Some(r) = row {
            out.write_all(row_text(p, &r).as_bytes())?;
            out.flush()?;
            rows.push(r);
        }
    }
    if p.output.is_none() {
        writeln!(out, "{RESULT_LINE}")?;
    }
    write_json(p, &info, &rows)?;
    Ok(rows)
}

/// One message size of a loopback run.
///
/// # Errors
///
/// See [`PerfError`].
pub fn loopback_size(
    p: &Params,
    sa: &Side,
    sb: &Side,
    da: &[Dest],
    db: &[Dest],
    size: u64,
    progress: &mut Progress,
) -> Result<Option<Row>, PerfError> {
    super::lat::prepare(sa, p, size)?;
    super::lat::prepare(sb, p, size)?;
    if p.warm_up {
        // --perform_warm_up: an unmeasured pass first (write, read and
        // atomic bandwidth tests, whose passive end needs no step).
        let w = p.warm_up_params();
        let mut s = BwSender::new(sa, db, &w, size);
        drive(&mut [&mut s], &Clock::new(), &mut Progress::hidden())?;
    }
    let clock = Clock::new();
    if !p.bw {
        let mut c = LatAgent::new(sa, db, p, size, true)?;
        let flag = c.done_flag();
        if LatAgent::is_active(p, false) {
            let mut s = LatAgent::new(sb, da, p, size, false)?.until(flag);
            drive(&mut [&mut c, &mut s], &clock, progress)?;
        } else {
            drive(&mut [&mut c], &clock, progress)?;
        }
        return Ok(lat_row(c.result()));
    }
    let send = p.verb == VerbKind::Send;
    let mut s_a = BwSender::new(sa, db, p, size);
    let mut s_b = if p.duplex {
        Some(BwSender::new(sb, da, p, size))
    } else {
        None
    };
    let mut r_b = if send {
        Some(BwReceiver::new(sb, p, size)?.until(s_a.done_flag()))
    } else {
        None
    };
    let mut r_a = match (&mut s_b, send) {
        (Some(s), true) => Some(BwReceiver::new(sa, p, size)?.until(s.done_flag())),
        _ => None,
    };
    {
        let mut agents: Vec<&mut dyn Agent> = vec![&mut s_a];
        if let Some(s) = &mut s_b {
            agents.push(s);
        }
        if let Some(r) = &mut r_b {
            agents.push(r);
        }
        if let Some(r) = &mut r_a {
            agents.push(r);
        }
        drive(&mut agents, &clock, progress)?;
    }
    let mut result = s_a.result();
    if let Some(s) = &s_b {
        result = result.combined(&s.result());
    }
    Ok(Some(Row::Bw(result)))
}

/// The end of a networked run that only keeps its device going (write,
/// read and atomic servers) until the peer says it is done.
struct Passive<'a> {
    side: &'a Side,
    until: Rc<Cell<bool>>,
}

impl Agent for Passive<'_> {
    fn step(&mut self, _clock: &Clock) -> Result<Step, PerfError> {
        // Polling drives the soft provider's inline progress; nothing is
        // expected on these CQs.
        let mut wc = [WorkCompletion::default()];
        let n = self.side.rcq.poll(&mut wc).ctx("poll_cq")?;
        if n > 0 {
            super::bw::check_wc(&wc[0], "receive", 0, 0)?;
        }
        Ok(Step {
            done: self.until.get(),
            progressed: false,
        })
    }

    fn progress(&self) -> f64 {
        0.0
    }
}

struct NetState<'l> {
    link: &'l mut PeerLink,
    peer_flag: Rc<Cell<bool>>,
    peer_done: Option<String>,
}

impl NetState<'_> {
    fn handle(&mut self, line: String) -> Result<(), PerfError> {
        if line == "SENT" {
            self.peer_flag.set(true);
        } else if line.starts_with("DONE") {
            self.peer_flag.set(true);
            self.peer_done = Some(line);
        } else {
            return Err(PerfError::Failed(format!("unexpected message from the peer: {line:?}")));
        }
        Ok(())
    }
}

/// Receive-CQ polls per step of a latency end alone in its process (see
/// [`LatAgent::spinning`]): a few microseconds of polling on shared memory
/// (tens on UDP, where an empty poll is a system call) before the loop
/// looks at the control connection again.
const NET_RECV_SPIN: u32 = 64;

/// Drives this end's agents while watching the TCP connection: `SENT` from
/// the peer (its sender finished) raises `peer_flag`; our own `sent` flag
/// is announced the same way. `watch`: give up after [`STALL_TIMEOUT`]
/// without progress. An end with only a [`Passive`] agent (the target of
/// WRITEs, READs and atomics) sees no completion however well the run
/// goes: its peer, which does, watches for stalls, and its exit closes
/// the TCP connection (before, such a server gave up on every run longer
/// than the timeout and left its peer's QP without answers).
fn net_drive(
    agents: &mut [&mut dyn Agent],
    sent: Option<Rc<Cell<bool>>>,
    st: &mut NetState<'_>,
    clock: &Clock,
    progress: &mut Progress,
    watch: bool,
) -> Result<(), PerfError> {
    let mut done = vec![false; agents.len()];
    let mut announced = false;
    let mut last_progress = clock.now();
    let mut spins = 0u32;
    let mut moved = false;
    loop {
        for (i, a) in agents.iter_mut().enumerate() {
            if !done[i] {
                let s = a.step(clock)?;
                done[i] = s.done;
                moved |= s.progressed;
            }
        }
        if !announced && sent.as_ref().is_some_and(|f| f.get()) {
            st.link.send_line("SENT")?;
            announced = true;
        }
        if done.iter().all(|d| *d) {
            break;
        }
        spins = spins.wrapping_add(1);
        // The TCP connection and the clock are looked at every 256 turns,
        // busy or idle: three system calls per idle turn made the polling
        // loop (on both ends) several times slower than the link it
        // measures.
        if spins.is_multiple_of(256) {
            while let Some(l) = st.link.try_recv_line()? {
                st.handle(l)?;
            }
            let now = clock.now();
            if std::mem::take(&mut moved) {
                last_progress = now;
            } else if watch && now - last_progress > STALL_TIMEOUT.as_nanos() as u64 && !st.peer_flag.get() {
                return Err(PerfError::Failed(format!(
                    "no progress for {} s (a lost completion or a peer that stopped)",
                    STALL_TIMEOUT.as_secs()
                )));
            }
            // The indicator limits itself to its own pace.
            let f = agents.iter().map(|a| a.progress()).fold(1.0, f64::min);
            progress.update(f);
        }
    }
    if !announced && sent.is_some() {
        st.link.send_line("SENT")?;
    }
    Ok(())
}

/// Runs this end against a peer reached through `link` (already connected):
/// greeting, address exchange, QP connection, then every size.
///
/// # Errors
///
/// See [`PerfError`].
pub fn run_networked(
    p: &Params,
    dev: &Device,
    mut link: PeerLink,
    server: bool,
    out: &mut dyn Write,
) -> Result<Vec<Row>, PerfError> {
    if server {
        link.hello_server(p)?;
    } else {
        link.hello_client(p)?;
    }
    let ctx = dev.open().ctx(&format!("opening {}", dev.name()))?;
    let mut side = Side::new(&ctx, p, p.max_size(), if server { 2 } else { 1 })?;
    let mine = side.dests();
    let n = mine.len();
    let theirs = if server {
        let t = link.recv_dests(n)?;
        link.send_dests(&mine)?;
        t
    } else {
        link.send_dests(&mine)?;
        link.recv_dests(n)?
    };
    side.connect(&theirs)?;
    let placement = if server {
        format!("server on TCP port {}", p.tcp_port)
    } else {
        match &p.mode {
            Mode::Client(h) => format!("client of {h}:{}", p.tcp_port),
            _ => "client".to_string(),
        }
    };
    let info = banner_info(p, &side, placement, !server);
    if p.output.is_none() {
        out.write_all(report::banner(&info).as_bytes())?;
    }
    print_addresses(out, p, &mine, &theirs)?;
    out.write_all(header(p).as_bytes())?;
    out.flush()?;
    let mut rows = Vec::new();
    let mut progress = Progress::new(p.test.name());
    for &size in &p.sizes {
        super::lat::prepare(&side, p, size)?;
        link.sync(size)?;
        progress.restart(format!("{} {size} B", p.test));
        let row = networked_size(p, &side, &theirs, size, server, &mut link, &mut progress)?;
        progress.clear();
        if let Some(r) = row {
            out.write_all(row_text(p, &r).as_bytes())?;
            out.flush()?;
            rows.push(r);
        }
    }
    if p.output.is_none() {
        writeln!(out, "{RESULT_LINE}")?;
    }
    link.send_line("BYE")?;
    let _ = link.recv_line();
    write_json(p, &info, &rows)?;
    Ok(rows)
}

fn networked_size(
    p: &Params,
    side: &Side,
    theirs: &[Dest],
    size: u64,
    server: bool,
    link: &mut PeerLink,
    progress: &mut Progress,
) -> Result<Option<Row>, PerfError> {
    let clock = Clock::new();
    let mut st = NetState {
        link,
        peer_flag: Rc::new(Cell::new(false)),
        peer_done: None,
    };
    let client = !server;
    let (row, mine_for_peer) = if p.bw {
        let send_active = client || p.duplex;
        let recv_active = p.verb == VerbKind::Send && (server || p.duplex);
        let mut sender = send_active.then(|| BwSender::new(side, theirs, p, size));
        let sent = sender.as_mut().map(BwSender::done_flag);
        let mut receiver = if recv_active {
            Some(BwReceiver::new(side, p, size)?.until(st.peer_flag.clone()))
        } else {
            None
        };
        // A side that receives nothing through its CQs (the target of
        // WRITEs, READs and atomics) keeps polling until the peer's
        // operations are complete, or an inline device stops taking them
        // in: also a bidirectional sender whose own part is done first.
        let mut passive = (!recv_active && (!send_active || p.duplex)).then(|| Passive {
            side,
            until: st.peer_flag.clone(),
        });
        let watch = sender.is_some() || receiver.is_some();
        {
            let mut agents: Vec<&mut dyn Agent> = Vec::new();
            if let Some(s) = &mut sender {
                agents.push(s);
            }
            if let Some(r) = &mut receiver {
                agents.push(r);
            }
            if let Some(x) = &mut passive {
                agents.push(x);
            }
            net_drive(&mut agents, sent, &mut st, &clock, progress, watch)?;
        }
        let mine = sender.as_ref().map(BwSender::result);
        let row = match (&mine, &receiver) {
            (Some(m), _) => Some(*m),
            (None, Some(r)) => Some(r.result()),
            (None, None) => None,
        };
        (row, mine)
    } else {
        let active = LatAgent::is_active(p, client);
        let mut agent = if active {
            Some(
                LatAgent::new(side, theirs, p, size, client)?
                    .until(st.peer_flag.clone())
                    .spinning(NET_RECV_SPIN),
            )
        } else {
            None
        };
        let sent = agent.as_mut().map(LatAgent::done_flag);
        let mut passive = (!active).then(|| Passive {
            side,
            until: st.peer_flag.clone(),
        });
        let watch = agent.is_some();
        {
            let mut agents: Vec<&mut dyn Agent> = Vec::new();
            if let Some(a) = &mut agent {
                agents.push(a);
            }
            if let Some(x) = &mut passive {
                agents.push(x);
            }
            net_drive(&mut agents, sent, &mut st, &clock, progress, watch)?;
        }
        let row = agent.as_ref().and_then(LatAgent::result);
        return finish_size(&mut st, None, size).map(|_| lat_row(row));
    };
    let peer = finish_size(&mut st, mine_for_peer.as_ref(), size)?;
    Ok(row.map(|r| match (p.duplex, peer) {
        (true, Some(pr)) => Row::Bw(r.combined(&pr)),
        _ => Row::Bw(r),
    }))
}

/// Sends our `DONE` and waits for the peer's.
fn finish_size(st: &mut NetState<'_>, mine: Option<&BwResult>, size: u64) -> Result<Option<BwResult>, PerfError> {
    st.link.send_line(&done_line(mine))?;
    while st.peer_done.is_none() {
        let l = st.link.recv_line()?;
        st.handle(l)?;
    }
    parse_done(st.peer_done.as_deref().unwrap_or("DONE - - - 0"), size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(args: &[&str]) -> Params {
        crate::cli::perftest::args::testing::params(args).unwrap()
    }

    fn devices() -> (Device, Device) {
        softverbs::soft::embedded_default().unwrap();
        loopback_devices(&params(&["write_bw"])).unwrap()
    }

    fn run_text(args: &[&str]) -> String {
        let (a, b) = devices();
        let p = params(args);
        let mut out = Vec::new();
        run_loopback(&p, &a, &b, &mut out).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        String::from_utf8(out).unwrap()
    }

    fn rows(text: &str) -> Vec<Vec<f64>> {
        text.lines()
            .filter(|l| l.starts_with(' ') && l.split_whitespace().all(|w| w.parse::<f64>().is_ok()))
            .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
            .collect()
    }

    #[test]
    fn tiny_loopback_runs_of_every_test() {
        for (args, cols) in [
            (&["write_bw", "-n", "50", "-s", "4096"][..], 5),
            (&["read_bw", "-n", "20", "-s", "1024", "-q", "2"], 5),
            (&["send_bw", "-n", "40", "-s", "64", "-Q", "8"], 5),
            (&["atomic_bw", "-n", "20"], 5),
            (&["write_lat", "-n", "20", "-s", "8"], 9),
            (&["read_lat", "-n", "10"], 9),
            (&["send_lat", "-n", "10", "-s", "100"], 9),
            (&["atomic_lat", "-n", "10", "-A", "CMP_AND_SWAP"], 9),
            (&["send_bw", "-n", "20", "-s", "512", "-c", "UD"], 5),
            (&["write_bw", "-n", "24", "-s", "100", "-c", "UC", "-b", "-l", "4"], 5),
            (&["send_bw", "-n", "20", "-s", "256", "-b", "-e"], 5),
            (&["send_lat", "-n", "10", "-c", "UD", "-e"], 9),
            // The same tests over the UDP link (two devices on 127.0.0.1).
            (&["write_bw", "-n", "50", "-s", "4096", "--link", "udp"], 5),
            (&["read_lat", "-n", "10", "--link", "udp"], 9),
            (&["send_lat", "-n", "10", "--link", "udp"], 9),
            (&["write_lat", "-n", "10", "--link", "udp"], 9),
            // And over shared memory (two devices of this process).
            (&["write_bw", "-n", "50", "-s", "4096", "--link", "shm"], 5),
            (&["send_lat", "-n", "10", "--link", "shm"], 9),
        ] {
            let text = run_text(args);
            let r = rows(&text);
            assert_eq!(r.len(), 1, "{args:?}:\n{text}");
            assert_eq!(r[0].len(), cols, "{args:?}:\n{text}");
            assert!(r[0][2] > 0.0 && r[0][3] > 0.0, "{args:?}:\n{text}");
            assert!(text.contains(" local address: LID 0000 QPN 0x"), "{text}");
            assert!(text.contains(" remote address: LID 0000 QPN 0x"), "{text}");
        }
    }

    #[test]
    fn all_sizes_and_json() {
        let dir = std::env::temp_dir().join(format!("svperf-{}.json", std::process::id()));
        let path = dir.to_str().unwrap();
        let text = run_text(&["write_bw", "-a", "-n", "5", "--out_json", path]);
        let r = rows(&text);
        assert_eq!(r.len(), 23, "{text}");
        assert_eq!(r[22][0], (1u64 << 23) as f64);
        let j = std::fs::read_to_string(path).unwrap();
        let _ = std::fs::remove_file(path);
        assert_eq!(j.matches("\"MsgSize\"").count(), 23);
    }

    #[test]
    fn duration_mode() {
        let text = run_text(&["write_lat", "-D", "1", "-f", "0"]);
        assert!(text.contains("t_avg[usec]    tps average"), "{text}");
        assert_eq!(rows(&text).len(), 1, "{text}");
    }

    /// Runs `args` as a server on device `b` (its own thread) and a client
    /// on device `a`, the addresses exchanged over TCP as between two
    /// processes; returns the client's and the server's reports.
    fn networked_pair(args: &[&str], a: &Device, b: &Device) -> (String, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port().to_string();
        let mut args = args.to_vec();
        args.extend_from_slice(&["-p", &port]);
        let mut sp = params(&args);
        sp.mode = Mode::Server;
        let mut cp = params(&args);
        cp.mode = Mode::Client("127.0.0.1".into());
        let b = b.clone();
        let server = std::thread::spawn(move || {
            let link = PeerLink::accept(&l).unwrap();
            let mut out = Vec::new();
            run_networked(&sp, &b, link, true, &mut out).map(|_| String::from_utf8(out).unwrap())
        });
        let link = PeerLink::connect("127.0.0.1", port.parse().unwrap()).unwrap();
        let mut out = Vec::new();
        let client = run_networked(&cp, a, link, false, &mut out);
        let ctext = String::from_utf8(out).unwrap();
        let stext = server.join().unwrap();
        client.unwrap_or_else(|e| panic!("{args:?} client: {e}\n{ctext}"));
        let stext = stext.unwrap_or_else(|e| panic!("{args:?} server: {e}"));
        (ctext, stext)
    }

    /// [`networked_pair`] between two inline UDP devices, each driven only
    /// by its own thread's verbs (as between two processes), with a local
    /// ACK timeout of 1.07 s per try (`-u 18`): an inline device answers
    /// only while its thread is in a verb, and on a loaded host a thread can
    /// wait half a second for a CPU, which exhausts the 8 tries of the
    /// default 67 ms (the peer's WRITEs then end with RETRY_EXC_ERR, one
    /// full-suite run in two at load ~15 on 2 cores).
    fn between_inline_udp_devices(args: &[&str], names: (&str, &str)) -> (String, String) {
        let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let a = udp_device(names.0, lo, false, NetOpts::default()).unwrap();
        let b = udp_device(names.1, lo, false, NetOpts::default()).unwrap();
        let mut args = args.to_vec();
        args.extend_from_slice(&["-u", "18"]);
        networked_pair(&args, &a, &b)
    }

    /// A side waiting for the peer's WRITE in its memory must still call
    /// into its device, or the WRITE is never read off the socket (before:
    /// the sender's first WRITE ended with RETRY_EXC_ERR).
    #[test]
    fn write_lat_between_inline_udp_devices() {
        let (c, s) = between_inline_udp_devices(&["write_lat", "-n", "200", "-s", "8"], ("pwl_a", "pwl_b"));
        for text in [&c, &s] {
            let r = rows(text);
            assert_eq!(r.len(), 1, "{text}");
            assert_eq!(r[0][1], 200.0, "{text}");
        }
    }

    /// A bidirectional WRITE test: the side whose WRITEs complete first
    /// keeps polling until the peer's are complete too (before: it stopped,
    /// and the peer's last WRITEs ended with RETRY_EXC_ERR, in two runs of
    /// three here; which side finishes first is timing, hence three runs).
    #[test]
    fn bidirectional_write_bw_between_inline_udp_devices() {
        for _ in 0..3 {
            let (c, s) =
                between_inline_udp_devices(&["write_bw", "-b", "-n", "2000", "-s", "65536"], ("pwb_a", "pwb_b"));
            for text in [&c, &s] {
                assert_eq!(rows(text).len(), 1, "{text}");
            }
        }
    }

    #[test]
    fn tcp_exchange_between_two_threads() {
        // Both ends use the in-process devices of this process, each from
        // its own thread; only the address exchange goes over TCP.
        let (a, b) = devices();
        for test in [
            &["send_bw", "-n", "40", "-s", "256"][..],
            &["write_lat", "-n", "20"],
            &["read_bw", "-n", "20", "-b"],
        ] {
            let (ctext, stext) = networked_pair(test, &a, &b);
            assert_eq!(rows(&ctext).len(), 1, "{test:?} client:\n{ctext}");
            assert!(stext.contains("Data ex. method : Ethernet"), "{stext}");
            if test[0] == "send_bw" || test[0] == "write_lat" || test.contains(&"-b") {
                assert_eq!(rows(&stext).len(), 1, "{test:?} server:\n{stext}");
            }
        }
    }
}
