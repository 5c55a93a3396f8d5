//! The `softverbs` command-line tool.
//!
//! One subcommand per module: [`devices`] (like `ibv_devices`) and
//! [`devinfo`] (like `ibv_devinfo`). Each module has an `Args` struct (its
//! clap arguments) and a `run` function; to add a subcommand (perf,
//! conformance, pingpong, sim), add a module, a [`Command`] variant and one
//! arm in [`run`]. The user tools' logic lives here too: [`pingpong`]
//! (`ibv_rc_pingpong`'s twin) and [`perftest`] (perftest's tools and the
//! scale test, wrapped by [`perf`]; the criterion benches of
//! `softverbs-benches` use it as well).
//!
//! Errors never panic: [`main`] prints `softverbs: <error>` on standard error
//! and exits with the status of the [`CliError`] (see [`EXIT_STATUS`]).

pub mod conformance;
pub mod devices;
pub mod devinfo;
pub mod perf;
pub mod perftest;
pub mod pingpong;
pub mod plot;
pub mod sim;
pub mod stats;

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use softverbs::verbs::{self, BackendKind, Device};

/// The exit-status text, as a literal for `concat!`.
macro_rules! exit_status_text {
    () => {
        "\
Exit status (every subcommand):
  0  success
  1  no RDMA device found (none for the selected backend, or no device or
     port with the name or number given)
  2  usage error (unknown option, bad value, a combination of options the
     command does not support)
  3  a device was found but a verbs call on it failed (open, query), or
     the run failed (an error completion, a lost peer, a perftest -w/-y
     limit not met, an output file that cannot be written)
  4  conformance: at least one case failed"
    };
}

/// The exit statuses of every subcommand, as `--help` and the README show
/// them.
pub const EXIT_STATUS: &str = exit_status_text!();

const ABOUT: &str = "RDMA verbs in pure Rust: inspect and exercise soft and hardware RDMA devices";

const LONG_ABOUT: &str = concat!(
    "\
RDMA verbs in pure Rust: inspect and exercise soft and hardware RDMA devices.

By default the tool first creates the embedded default: two soft RoCEv2
devices in this process, softverbs_0 (127.83.86.1) and softverbs_1
(127.83.86.2), joined by an in-process link. --no-embedded skips that, so
only devices that exist anyway (hardware, with --features hardware) are seen.

--backend selects the devices: soft (the soft provider) or hw (real ibverbs,
in a build with --features hardware). Listing commands (devices, devinfo)
default to every compiled-in backend; the others default to soft.

",
    exit_status_text!()
);

/// The `softverbs` command line.
#[derive(Debug, Parser)]
#[command(name = "softverbs", version, about = ABOUT, long_about = LONG_ABOUT, args_override_self = true)]
pub struct Cli {
    /// Options every subcommand takes.
    #[command(flatten)]
    pub global: GlobalOpts,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalOpts {
    /// Backend whose devices to use [default: all compiled-in backends for
    /// devices/devinfo, soft for the others]
    #[arg(long, global = true, value_enum, value_name = "BACKEND")]
    pub backend: Option<Backend>,
    /// Do not create the embedded default soft devices (softverbs_0,
    /// softverbs_1) in this process
    #[arg(long, global = true)]
    pub no_embedded: bool,
    /// No progress lines on standard error (shown for long runs: redrawn
    /// on a terminal, a line every 5 s otherwise)
    #[arg(long, global = true)]
    pub quiet: bool,
}

impl GlobalOpts {
    /// The backend a listing command uses: the one selected, or all
    /// compiled-in backends (`None`).
    pub fn listing_backend(&self) -> Option<BackendKind> {
        self.backend.map(BackendKind::from)
    }

    /// The backend any other command uses: the one selected, or soft.
    pub fn backend(&self) -> BackendKind {
        self.backend.map_or(BackendKind::Soft, BackendKind::from)
    }
}

/// A `--backend` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The soft provider (pure Rust RoCEv2, always compiled in)
    Soft,
    /// Real ibverbs through rdma-sys (needs a build with --features hardware)
    #[value(alias = "hardware")]
    Hw,
}

impl From<Backend> for BackendKind {
    fn from(b: Backend) -> BackendKind {
        match b {
            Backend::Soft => BackendKind::Soft,
            Backend::Hw => BackendKind::Hardware,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List RDMA devices with their node GUID and backend (like ibv_devices)
    #[command(after_long_help = EXIT_STATUS)]
    Devices(devices::Args),
    /// Show device and port attributes (like ibv_devinfo)
    #[command(after_long_help = EXIT_STATUS)]
    Devinfo(devinfo::Args),
    /// perftest-compatible bandwidth/latency tests (write_bw, send_lat, …)
    /// and the many-QP scale test
    #[command(after_long_help = EXIT_STATUS)]
    Perf(perf::Args),
    /// Run the verbs conformance suite and print a pass/fail/skip report
    #[command(after_long_help = EXIT_STATUS)]
    Conformance(conformance::Args),
    /// RC ping-pong between two processes or hosts over the UDP link (like
    /// ibv_rc_pingpong): `pingpong` on the server, `pingpong SERVER` on the
    /// client
    #[command(after_long_help = EXIT_STATUS)]
    Pingpong(pingpong::Args),
    /// The deterministic simulated fabric: `sim bench` (goodput/latency
    /// under loss), `sim run --seed S` (replay and trace a scenario), `sim
    /// fuzz`
    #[command(after_long_help = EXIT_STATUS)]
    Sim(sim::Args),
}

/// A failed command: what to print and the exit status.
#[derive(Debug)]
pub enum CliError {
    /// No device (or no device/port of the given name/number): exit 1.
    NotFound(String),
    /// A verbs call failed: exit 3.
    Verbs {
        /// What was being done (`softverbs_0`, `creating the embedded
        /// default`, …).
        context: String,
        /// The verbs error.
        error: verbs::Error,
    },
    /// Several devices failed; each was already reported. Exit with the
    /// given status.
    Reported(u8),
    /// Writing the output failed (other than a closed pipe): exit 3.
    Io(io::Error),
}

impl CliError {
    /// A verbs failure while doing `context`.
    pub fn verbs(context: impl Into<String>, error: verbs::Error) -> CliError {
        CliError::Verbs {
            context: context.into(),
            error,
        }
    }

    /// The process exit status.
    pub fn exit_status(&self) -> u8 {
        match self {
            CliError::NotFound(_) => 1,
            CliError::Verbs { .. } | CliError::Io(_) => 3,
            CliError::Reported(code) => *code,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::NotFound(msg) => f.write_str(msg),
            CliError::Verbs { context, error } => write!(f, "{context}: {error}"),
            CliError::Reported(code) => write!(f, "failed (exit status {code})"),
            CliError::Io(e) => write!(f, "writing output: {e}"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        CliError::Io(e)
    }
}

/// What a subcommand runs with: the global options, after the embedded
/// default has been set up.
#[derive(Debug, Clone)]
pub struct Env {
    /// The global options.
    pub global: GlobalOpts,
}

impl Env {
    /// Sets up the process: creates the embedded default soft devices
    /// unless `--no-embedded`.
    ///
    /// # Errors
    ///
    /// A verbs error if the embedded default cannot be created.
    pub fn new(global: GlobalOpts) -> Result<Env, CliError> {
        crate::cli::perftest::set_quiet(global.quiet);
        if !global.no_embedded {
            softverbs::soft::embedded_default()
                .map_err(|e| CliError::verbs("creating the embedded default soft devices", e))?;
        }
        Ok(Env { global })
    }

    /// The devices of `kind` (every compiled-in backend with `None`), in
    /// backend order.
    ///
    /// # Errors
    ///
    /// [`CliError::NotFound`] with one line saying, per backend, why there
    /// is no device, if there is none at all.
    pub fn devices(&self, kind: Option<BackendKind>) -> Result<Vec<Device>, CliError> {
        let kinds: &[BackendKind] = match kind {
            Some(ref k) => std::slice::from_ref(k),
            None => &[BackendKind::Soft, BackendKind::Hardware],
        };
        let mut found = Vec::new();
        let mut reasons = Vec::new();
        for &k in kinds {
            let listed = verbs::provider(k).and_then(|p| p.devices());
            match listed {
                Ok(devs) if devs.is_empty() => reasons.push(format!("backend {k}: {}", self.empty_reason(k))),
                Ok(devs) => found.extend(devs.into_iter().map(Device::from_ops)),
                Err(e) => reasons.push(format!("backend {k}: {}", e.detail())),
            }
        }
        if found.is_empty() {
            return Err(CliError::NotFound(format!(
                "No RDMA devices found ({})",
                reasons.join("; ")
            )));
        }
        Ok(found)
    }

    /// One device by name among those of `kind`.
    ///
    /// # Errors
    ///
    /// [`CliError::NotFound`] if there is no such device (the message lists
    /// the devices there are).
    pub fn device(&self, kind: Option<BackendKind>, name: &str) -> Result<Device, CliError> {
        let devs = self.devices(kind)?;
        if let Some(d) = devs.iter().find(|d| d.name() == name) {
            return Ok(d.clone());
        }
        let names: Vec<&str> = devs.iter().map(Device::name).collect();
        Err(CliError::NotFound(format!(
            "no RDMA device named '{name}' (found: {})",
            names.join(", ")
        )))
    }

    fn empty_reason(&self, kind: BackendKind) -> &'static str {
        match kind {
            BackendKind::Soft if self.global.no_embedded => {
                "no soft devices in this process (the embedded default is off: --no-embedded)"
            }
            BackendKind::Soft => "no soft devices in this process",
            BackendKind::Hardware => "no devices (is an RDMA driver loaded? see /sys/class/infiniband)",
        }
    }
}

/// Runs a parsed command line, writing its report to `out`.
///
/// # Errors
///
/// The failure to report, with its exit status.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    let env = Env::new(cli.global)?;
    match &cli.command {
        Command::Devices(args) => devices::run(&env, args, out),
        Command::Devinfo(args) => devinfo::run(&env, args, out),
        Command::Perf(args) => perf::run(&env, args, out),
        Command::Conformance(args) => conformance::run(&env, args, out),
        Command::Pingpong(args) => pingpong::run(&env, args, out),
        Command::Sim(args) => sim::run(&env, args, out),
    }
}

/// The whole program: parses `std::env::args`, runs, prints any error as
/// `softverbs: <error>` and returns the exit status.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to
            // stderr with status 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(CliError::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`softverbs devinfo -v | head`): not an error.
        Err(CliError::Io(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            if !matches!(e, CliError::Reported(_)) {
                eprintln_safe(&format!("softverbs: {e}"));
            }
            ExitCode::from(e.exit_status())
        }
    }
}

/// Prints a line on standard error, ignoring failures (never panics).
pub fn eprintln_safe(line: &str) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn backend_defaults() {
        let g = GlobalOpts::default();
        assert_eq!(g.listing_backend(), None);
        assert_eq!(g.backend(), BackendKind::Soft);
        let g = GlobalOpts {
            backend: Some(Backend::Hw),
            no_embedded: false,
            quiet: false,
        };
        assert_eq!(g.listing_backend(), Some(BackendKind::Hardware));
        assert_eq!(g.backend(), BackendKind::Hardware);
    }

    #[test]
    fn global_options_after_the_subcommand() {
        let cli = Cli::try_parse_from(["softverbs", "devices", "--backend", "hw", "--no-embedded"]).unwrap();
        assert_eq!(cli.global.backend, Some(Backend::Hw));
        assert!(cli.global.no_embedded);
        let cli = Cli::try_parse_from(["softverbs", "--backend", "hardware", "devinfo"]).unwrap();
        assert_eq!(cli.global.backend, Some(Backend::Hw));
        assert!(Cli::try_parse_from(["softverbs", "--backend", "foo", "devices"]).is_err());
        // As with getopt, the last of a repeated option counts.
        let cli = Cli::try_parse_from([
            "softverbs",
            "--backend",
            "hw",
            "--backend",
            "soft",
            "devinfo",
            "-i",
            "2",
            "-i",
            "1",
        ])
        .unwrap();
        assert_eq!(cli.global.backend, Some(Backend::Soft));
        match cli.command {
            Command::Devinfo(a) => assert_eq!(a.port, Some(1)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(CliError::NotFound(String::new()).exit_status(), 1);
        assert_eq!(CliError::Reported(3).exit_status(), 3);
        assert_eq!(CliError::Io(io::Error::other("x")).exit_status(), 3);
        assert!(LONG_ABOUT.ends_with(EXIT_STATUS));
    }
}
