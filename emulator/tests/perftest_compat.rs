//! `softverbs perf` and `pingpong` as drop-ins for perftest and
//! `ibv_rc_pingpong`, `devinfo -v` against `ibv_devinfo -v`, the exit
//! statuses, the progress lines and the `--plot` charts.
//!
//! Tests that compare with the real tools run them when they are installed
//! (perftest, ibverbs-utils) and print a `SKIP:` line otherwise.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use clap::{CommandFactory, Parser};
use softverbs::verbs::BackendKind;
use softverbs_emulator::cli::perftest::{Params, PerfArgs};
use softverbs_emulator::cli::{Cli, Command as Sub};

fn softverbs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softverbs"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the softverbs binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `ib_write_bw ARGS` as `softverbs perf write_bw ARGS`, parsed.
fn perf_args(line: &str) -> Result<PerfArgs, clap::Error> {
    let mut words = line.split_whitespace();
    let tool = words.next().expect("a tool name");
    let test = tool.strip_prefix("ib_").unwrap_or(tool);
    let mut argv = vec!["softverbs", "perf", test];
    argv.extend(words);
    let cli = Cli::try_parse_from(argv)?;
    match cli.command {
        Sub::Perf(a) => Ok(*a.perf),
        other => panic!("not perf: {other:?}"),
    }
}

/// The tool is installed (its `--help` runs).
fn installed(tool: &str) -> Option<String> {
    let o = Command::new(tool).arg("--help").output().ok()?;
    let text = format!("{}{}", stdout(&o), stderr(&o));
    (!text.is_empty()).then_some(text)
}

/// Flag lines from perftest's own files (debian/tests/rxe_loopback,
/// run_perftest_loopback's usage line, the README's GPU example), then
/// common invocations that together use every option of perftest 4.5's
/// `ib_*_bw`/`ib_*_lat --help`.
const SAVED_LINES: &[&str] = &[
    // debian/tests/rxe_loopback and run_perftest_loopback
    "ib_write_bw -s 10",
    "ib_read_bw",
    "ib_send_bw",
    "ib_atomic_bw",
    "ib_write_lat",
    "ib_atomic_lat",
    // README (GPUDirect section)
    "ib_write_bw -d ib_dev --use_cuda=0 -a",
    // Typical scripts
    "ib_write_bw -d mlx5_0 -i 1 -F --report_gbits -a",
    "ib_write_bw -F -x 3 -q 4 -D 10 --report_gbits --cpu_util",
    "ib_send_bw -c UD -F -x 3 --report_gbits -a",
    "ib_send_lat -a -F -n 1000 -I 64",
    "ib_read_lat -F -a -n 1000 -o 1",
    "ib_read_bw -F -o 16 -s 65536 -n 5000 -N",
    "ib_atomic_bw -A CMP_AND_SWAP -F -o 8",
    "ib_write_bw -R -T 106 -x 3 --report_gbits -S 3",
    "ib_write_bw -z -F --tclass=96 --ipv6",
    "ib_write_bw -b -F --report-both -Q 16 -t 256 -l 8 -n 8000",
    "ib_send_bw -F --use-srq -r 1024 -e -X 0",
    "ib_write_lat -F -C -H -U -s 8",
    "ib_write_bw --run_infinitely -D 5 --output=bandwidth",
    "ib_write_bw -F --perform_warm_up --reversed -w 10 -y 0.1",
    "ib_write_bw -O --report-per-port -W counters/port_xmit_data -u 20 -L 64",
    "ib_send_bw -g -M ff0e::ffff:e101:101 -c UD",
    "ib_write_bw --mr_per_qp --odp --use_hugepages --use_old_post_send --dont_xchg_versions",
    "ib_write_bw --pkey_index=0 --dlid=3 --force-link=Ethernet --source_ip=10.0.0.1 --wait_destroy=1",
    "ib_write_bw --mmap=/dev/zero --mmap-offset=0 --disable_pcie_relaxed --retry_count=7",
    "ib_write_bw --rate_limit=10 --rate_units=g --rate_limit_type=SW --burst_size=8 --typical_pkt_size=1024",
    "ib_send_lat --inline_recv=64 --latency_gap=10 -f 1 -D 4 -p 18516 -m 1024",
    "ib_send_bw --recv_post_list=4 --log_dci_streams=2 --log_active_dci_streams=1",
    "ib_write_bw --aes_xts --encrypt_on_tx --sig_before --aes_block_size=512 --data_enc_keys_number=1",
    "ib_write_bw --kek_path=k --credentials_path=c --data_enc_key_app_path=a --out_json --out_json_file=r.json",
];

#[test]
fn skeletons_keep_the_layout_not_the_figures() {
    assert_eq!(skeleton(" 64      100  2.5   \t"), " #       #    #     \t");
    // Padded to 7, or overflowing it: the same layout.
    // "%-7.2lf" then 8 spaces.
    assert_eq!(skeleton(" 23.02          x"), skeleton(" 10136.78        x"));
}

#[test]
fn saved_perftest_lines_parse_and_resolve() {
    for line in SAVED_LINES {
        let a = perf_args(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        let p = Params::from_args(&a, BackendKind::Soft).unwrap_or_else(|e| panic!("{line}: {e}"));
        // Every flag without effect is named once, on its own line.
        if line.contains("--ipv6") {
            assert!(
                p.notes.iter().any(|n| n.starts_with("--ipv6 ignored: ")),
                "{line}: {:?}",
                p.notes
            );
        }
        if line.contains(" -S 3") {
            assert!(
                p.notes.iter().any(|n| n.starts_with("-S 3 ignored: ")),
                "{line}: {:?}",
                p.notes
            );
        }
    }
    let a = perf_args("ib_write_bw -F -x 3 -q 4 -D 10 --report_gbits --cpu_util").expect("parse");
    assert_eq!((a.gid_index, a.qps, a.duration), (Some(3), 4, Some(10)));
    assert!(a.cpu_freq && a.report_gbits && a.no_effect.cpu_util);
}

#[test]
fn every_flag_of_perftest_help_is_accepted() {
    let mut cmd = Cli::command();
    cmd.build();
    let perf = cmd.find_subcommand("perf").expect("perf").clone();
    let mut checked = 0;
    for tool in [
        "ib_write_bw",
        "ib_write_lat",
        "ib_read_bw",
        "ib_read_lat",
        "ib_send_bw",
        "ib_send_lat",
        "ib_atomic_bw",
        "ib_atomic_lat",
    ] {
        let Some(help) = installed(tool) else {
            println!("SKIP: {tool} is not installed (apt-get install perftest)");
            return;
        };
        for line in help.lines() {
            let t = line.trim_start();
            if !t.starts_with('-') {
                continue;
            }
            let spec = t.split(|c: char| c.is_whitespace() || c == '=').collect::<Vec<_>>();
            // "-a," "--all" or "--out_json"
            let (short, long) = if spec[0].len() == 3 && spec[0].ends_with(',') {
                (spec[0].chars().nth(1), spec.get(1).and_then(|l| l.strip_prefix("--")))
            } else {
                (None, spec[0].strip_prefix("--"))
            };
            let Some(long) = long else { continue };
            let arg = perf
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .unwrap_or_else(|| panic!("{tool}: --{long} is not accepted ({t})"));
            if let Some(s) = short {
                assert_eq!(arg.get_short(), Some(s), "{tool}: -{s} is not --{long}");
            }
            if long == "help" || long == "version" {
                continue;
            }
            // The flag parses: with a value if it takes one.
            let takes_value = arg.get_action().takes_values();
            let value = match long {
                "connection" => "RC",
                "atomic_type" => "FETCH_AND_ADD",
                "output" => "bandwidth",
                "mtu" => "1024",
                _ => "2",
            };
            let test = tool.strip_prefix("ib_").expect("ib_ prefix");
            let flag = format!("--{long}");
            let mut argv = vec!["softverbs", "perf", test, &flag];
            if takes_value {
                argv.push(value);
            }
            if long == "run_infinitely" {
                argv.extend(["-D", "5"]);
            }
            Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} flags checked");
}

#[test]
fn a_repeated_flag_takes_its_last_value() {
    let a = perf_args("ib_write_bw -s 64 -n 100 -s 4096 -n 200 -c UC -c RC").expect("parse");
    assert_eq!((a.size, a.iters), (Some(4096), Some(200)));
    let p = Params::from_args(&a, BackendKind::Soft).expect("resolve");
    assert_eq!(p.connection.name(), "RC");
    let cli =
        Cli::try_parse_from(["softverbs", "pingpong", "-n", "5", "-n", "7", "-s", "1", "-s", "9"]).expect("parse");
    match cli.command {
        Sub::Pingpong(a) => assert_eq!((a.iters, a.size), (7, 9)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_silent_clamping() {
    // A value the test cannot use is refused (exit 2) or said on stderr.
    for bad in ["-t 0", "-r 0", "-Q 0", "-D 0"] {
        assert!(
            perf_args(&format!("ib_send_bw {bad}")).is_err(),
            "{bad} must be refused"
        );
    }
    let p = Params::from_args(&perf_args("ib_write_bw -t 16 -Q 64").unwrap(), BackendKind::Soft).unwrap();
    assert_eq!(p.cq_mod, 16);
    assert!(
        p.notes.iter().any(|n| n.contains("-Q 64 lowered to the tx depth 16")),
        "{:?}",
        p.notes
    );
    let p = Params::from_args(&perf_args("ib_write_bw -D 3").unwrap(), BackendKind::Soft).unwrap();
    assert!(
        p.notes.iter().any(|n| n.contains("margin lowered to 0.75 s")),
        "{:?}",
        p.notes
    );
    // An inline size above the device's: said when the run starts.
    let o = softverbs(&["--quiet", "perf", "write_bw", "-n", "20", "-s", "64", "-I", "100000"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("inline size 100000 lowered to the device's max_inline_data"),
        "{}",
        stderr(&o)
    );
    let o = softverbs(&["perf", "write_bw", "-n", "20", "-S", "2", "--ipv6"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("softverbs: perf write_bw: -S 2 ignored: "), "{err}");
    assert!(err.contains("softverbs: perf write_bw: --ipv6 ignored: "), "{err}");
}

#[test]
fn perftest_units_and_output_modes() {
    let o = softverbs(&["perf", "write_bw", "-n", "20", "-s", "4096"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"),
        "{}",
        stdout(&o)
    );
    // --output: one number per size, nothing else.
    let o = softverbs(&["perf", "write_bw", "-n", "20", "-s", "4096", "--output", "bandwidth"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let v: f64 = out.trim().parse().unwrap_or_else(|e| panic!("{out:?}: {e}"));
    assert!(v > 0.0 && out.lines().count() == 1, "{out}");
    let o = softverbs(&["perf", "write_lat", "-n", "20", "--output", "bandwidth"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // --reversed: the other device sends (in-process link); over UDP the
    // loopback devices are made per role, so it is said to be ignored.
    let o = softverbs(&["perf", "write_bw", "-n", "20", "--reversed"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("Device         : softverbs_1\n"), "{}", stdout(&o));
    let o = softverbs(&["perf", "write_bw", "-n", "20", "--reversed", "--link", "udp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--reversed ignored: over --link udp"),
        "{}",
        stderr(&o)
    );
    // -V
    let o = softverbs(&["perf", "write_bw", "-V"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("softverbs perf "), "{}", stdout(&o));
}

/// The documented table, checked one subcommand after another.
#[test]
fn one_exit_status_table() {
    let help = stdout(&softverbs(&["--help"]));
    for row in [
        "  0  success",
        "  1  no RDMA device found",
        "  2  usage error",
        "  3  a device was found but a verbs call on it failed",
        "  4  conformance: at least one case failed",
    ] {
        assert!(help.contains(row), "--help lacks {row:?}:\n{help}");
    }
    let cases: &[(&[&str], i32)] = &[
        (&["devices"], 0),
        (&["perf", "send_lat", "-n", "20"], 0),
        // 1: no such device or port, whichever subcommand.
        (&["devinfo", "-d", "nosuch"], 1),
        (&["devinfo", "-i", "2"], 1),
        (&["perf", "write_bw", "-i", "2"], 1),
        (&["perf", "write_bw", "-d", "nosuch"], 1),
        // 2: usage errors, from the parser or from a check after it.
        (&["perf", "write_bw", "--nosuch"], 2),
        (&["perf", "write_bw", "-t", "0"], 2),
        (&["perf", "write_bw", "--server"], 2),
        (&["perf", "read_bw", "-c", "UC"], 2),
        (&["perf", "write_bw", "-D", "2", "-n", "10"], 2),
        (&["perf", "write_bw", "--run_infinitely"], 2),
        (
            &["perf", "write_bw", "--run_infinitely", "-D", "2", "--links", "udp"],
            2,
        ),
        (&["pingpong", "-m", "1000"], 2),
        (&["pingpong", "-n", "0"], 2),
        (&["pingpong", "--udp-port", "50000"], 2),
        (&["sim", "bench", "--nosuch"], 2),
        (&["devinfo", "-i", "0"], 2),
        // 3: the run failed (here perftest's verifier).
        (&["perf", "write_bw", "-n", "20", "-w", "1e12"], 3),
    ];
    for (args, code) in cases {
        let o = softverbs(args);
        assert_eq!(
            o.status.code(),
            Some(*code),
            "{args:?}\nstdout:\n{}\nstderr:\n{}",
            stdout(&o),
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_duration_run_lasts_its_duration_and_reports_progress() {
    // Standard error is a pipe here: progress comes as lines, the first
    // after 3 s. The run cannot end before its 5 s.
    let t = Instant::now();
    let o = softverbs(&["perf", "write_bw", "-D", "5", "-f", "1", "-s", "4096"]);
    let elapsed = t.elapsed().as_secs_f64();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(elapsed >= 5.0, "-D 5 ended after {elapsed:.2} s");
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("softverbs: write_bw 4096 B ") && l.ends_with(" s)")),
        "no progress line:\n{err}"
    );
    let o = softverbs(&["--quiet", "perf", "write_bw", "-D", "4", "-f", "1", "-s", "4096"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("softverbs: write_bw 4096 B"), "{}", stderr(&o));
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softverbs_{}_{name}", std::process::id()))
}

/// The SVG's data lines (per series colour, the most points any
/// 2-pixel polyline of that colour has: the series itself, its legend
/// sample has 2) and its text elements.
fn svg_parts(path: &PathBuf) -> (Vec<usize>, Vec<String>) {
    let text = std::fs::read_to_string(path).expect("the SVG file");
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let mut series: Vec<(String, usize)> = Vec::new();
    for n in doc.descendants().filter(|n| n.tag_name().name() == "polyline") {
        if n.attribute("stroke-width") != Some("2") {
            continue;
        }
        let colour = n.attribute("stroke").unwrap_or_default().to_string();
        let points = n.attribute("points").unwrap_or_default().split_whitespace().count();
        match series.iter_mut().find(|(c, _)| *c == colour) {
            Some((_, most)) => *most = (*most).max(points),
            None => series.push((colour, points)),
        }
    }
    let lines = series.into_iter().map(|(_, n)| n).collect();
    let texts = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect();
    (lines, texts)
}

#[test]
fn perf_plot_draws_one_line_per_backend() {
    let path = tmp("perf.svg");
    let p = path.to_str().expect("UTF-8 path");
    let o = softverbs(&["perf", "write_bw", "-a", "-n", "20", "--backends", "soft", "--plot", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (lines, texts) = svg_parts(&path);
    // One line of 23 sizes (2 B to 8 MiB).
    assert_eq!(lines, [23], "{texts:?}");
    for t in [
        "softverbs perf write_bw",
        "soft BW average",
        "BW average [MB/sec]",
        "message size [bytes]",
        "8M",
    ] {
        assert!(texts.iter().any(|x| x == t), "no {t:?} in {texts:?}");
    }
    let _ = std::fs::remove_file(&path);

    let o = softverbs(&["perf", "send_lat", "-s", "8", "-n", "50", "--plot", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (lines, texts) = svg_parts(&path);
    // Typical and 99th percentile; the legend sample has 2 points.
    assert_eq!(lines, [2, 2], "{texts:?}");
    assert!(texts.iter().any(|x| x == "soft t_typical"), "{texts:?}");
    assert!(texts.iter().any(|x| x == "soft 99% percentile"), "{texts:?}");
    let _ = std::fs::remove_file(&path);

    let o = softverbs(&["perf", "scale", "--plot", p]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn sim_bench_plot_draws_goodput_and_p99_against_loss() {
    let path = tmp("sim.svg");
    let p = path.to_str().expect("UTF-8 path");
    let o = softverbs(&["sim", "bench", "-n", "20", "--loss", "0,1,5", "--plot", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (lines, texts) = svg_parts(&path);
    // A colour per operation and loss recovery (go-back-N and selective
    // repeat by default), its lines with a point per loss rate.
    assert_eq!(lines, [3, 3, 3, 3], "{texts:?}");
    for t in [
        "sim bench: goodput against loss",
        "sim bench: p99 completion latency against loss",
        "goodput [Gb/s]",
        "p99 [usec]",
        "loss [%]",
        "write gbn",
        "write sr",
        "send gbn",
        "send sr",
    ] {
        assert!(texts.iter().any(|x| x == t), "no {t:?} in {texts:?}");
    }
    let _ = std::fs::remove_file(&path);
}

/// The field names of an `ibv_devinfo -v` report, in order (`max_qp`,
/// `GID[  0]`, `completion_timestamp_mask not supported`, …).
fn fields(report: &str) -> Vec<String> {
    report
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once(':') {
            Some((k, _)) => k.to_string(),
            None => l.to_string(),
        })
        .collect()
}

/// `softverbs devinfo -v` has every field of `ibv_devinfo -v` run over
/// softverbs' own libibverbs.so.1, in the same order, with the same values
/// except the device's addresses (GUIDs, GIDs: different devices).
#[test]
fn devinfo_v_has_every_field_of_ibv_devinfo_v() {
    if installed("ibv_devinfo").is_none() {
        println!("SKIP: ibv_devinfo is not installed (apt-get install ibverbs-utils)");
        return;
    }
    // The library of this build (emulator/ibverbs/mklibdir.sh builds it).
    let Some(dir) = library_dir("libdir") else { return };
    let theirs = Command::new("ibv_devinfo")
        .args(["-v", "-d", "softverbs_0"])
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("ibv_devinfo");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(theirs.status.success(), "ibv_devinfo: {}", stderr(&theirs));
    let theirs = stdout(&theirs);
    let ours = softverbs(&["devinfo", "-v", "-d", "softverbs_0"]);
    assert!(ours.status.success(), "{}", stderr(&ours));
    let ours = stdout(&ours);

    // Every field of theirs, in their order (ours has more: backend,
    // softverbs' soft_* lines).
    let mine = fields(&ours);
    let mut at = 0;
    for f in fields(&theirs) {
        match mine[at..].iter().position(|m| *m == f) {
            Some(i) => at += i + 1,
            None => {
                panic!("softverbs devinfo -v lacks {f:?} (or has it out of order)\nours:\n{ours}\ntheirs:\n{theirs}")
            }
        }
    }
    // The same values, but for the addresses.
    let differ = |l: &&str| !(l.contains("guid:") || l.contains("GID["));
    for line in theirs.lines().filter(differ) {
        assert!(ours.lines().any(|l| l == line), "{line:?} differs\nours:\n{ours}");
    }
    // Both write a RoCE v2 GID as inet_ntop does.
    assert!(theirs.contains(", RoCE v2\n") && ours.contains("::ffff:127.83.86.1, RoCE v2\n"));
}

/// The library of this build as `libibverbs.so.1` in a fresh directory
/// (for `LD_LIBRARY_PATH`), or `None` with a SKIP line.
fn library_dir(name: &str) -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_softverbs"));
    let lib = exe.parent()?.join("libsoftverbs_ibverbs.so");
    if !lib.exists() {
        println!(
            "SKIP: {} not built (cargo build -p softverbs-ibverbs, or emulator/ibverbs/mklibdir.sh)",
            lib.display()
        );
        return None;
    }
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).ok()?;
    Some(dir)
}

/// A table line with each figure's first character replaced by `#` and
/// the rest by spaces: where the columns start, and the padding and tabs
/// between them, whatever the figures' widths. perftest pads figures to 7
/// characters (`%-7.2lf`); a longer one (a latency spike) pushes what
/// follows, so it counts as 7 wide.
fn skeleton(line: &str) -> String {
    let mut out = String::new();
    let mut number = 0;
    for c in line.chars() {
        if c.is_ascii_digit() || (number > 0 && c == '.') {
            number += 1;
            if number == 1 {
                out.push('#');
            } else if number <= 7 {
                out.push(' ');
            }
        } else {
            number = 0;
            out.push(c);
        }
    }
    out
}

/// The real `ib_write_bw` and `ib_send_lat` of perftest 4.5 (over
/// softverbs' libibverbs.so.1, both ends on this host) and `softverbs
/// perf` print the same banner keys, table headers and row layout.
#[test]
fn tables_are_laid_out_as_perftest_prints_them() {
    if installed("ib_write_bw").is_none() {
        println!("SKIP: perftest is not installed (apt-get install perftest)");
        return;
    }
    let Some(dir) = library_dir("perftest_libdir") else {
        return;
    };
    for (tool, test) in [("ib_write_bw", "write_bw"), ("ib_send_lat", "send_lat")] {
        let port = (19000 + std::process::id() % 1000).to_string();
        let common = [
            "-d",
            "softverbs_0",
            "-x",
            "0",
            "-n",
            "100",
            "-s",
            "64",
            "-p",
            port.as_str(),
        ];
        // `timeout`: a peer that never comes cannot hang the test.
        let mut server = Command::new("timeout")
            .args(["60", tool])
            .args(common)
            .env("LD_LIBRARY_PATH", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the perftest server");
        // The server listens soon; the client retries until it does.
        let mut theirs = None;
        for _ in 0..40 {
            let o = Command::new("timeout")
                .args(["60", tool])
                .args(common)
                .arg("127.0.0.1")
                .env("LD_LIBRARY_PATH", &dir)
                .output()
                .expect("run the perftest client");
            if o.status.success() {
                theirs = Some(stdout(&o));
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        // The server ends with its client (or its timeout).
        let _ = server.wait();
        let theirs = theirs.unwrap_or_else(|| panic!("{tool} never ran"));
        let o = softverbs(&["perf", test, "-n", "100", "-s", "64"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let ours = stdout(&o);
        // Banner keys (perftest's PCIe line does not apply here).
        for line in theirs.lines().filter(|l| l.contains(" : ") && !l.contains("PCIe")) {
            let key = line.split(" : ").next().expect("key").trim_end();
            assert!(
                ours.lines().any(|l| l.starts_with(key)),
                "{test}: no {key:?} line\nours:\n{ours}\ntheirs:\n{theirs}"
            );
        }
        let header = |s: &str| s.lines().find(|l| l.starts_with(" #bytes")).map(str::to_string);
        assert_eq!(header(&ours), header(&theirs), "{test}: the table header");
        let row = |s: &str| {
            s.lines()
                .find(|l| l.starts_with(" 64 "))
                .map(skeleton)
                .expect("the 64-byte row")
        };
        assert_eq!(
            row(&ours),
            row(&theirs),
            "{test}: the row layout\nours:\n{ours}\ntheirs:\n{theirs}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a server with `server_args` and then a client with `client_args`
/// (retrying until the server listens); returns both outputs.
fn pair(cmd: &str, server_args: &[&str], client_args: &[&str], env: Option<&PathBuf>) -> (String, String) {
    // `timeout`: a peer that never comes cannot hang the test.
    let mut s = Command::new("timeout");
    s.args(["60", cmd])
        .args(server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = env {
        s.env("LD_LIBRARY_PATH", d);
    }
    let server = s.spawn().expect("start the server");
    let mut client = None;
    for _ in 0..40 {
        let mut c = Command::new("timeout");
        c.args(["60", cmd]).args(client_args);
        if let Some(d) = env {
            c.env("LD_LIBRARY_PATH", d);
        }
        let o = c.output().expect("run the client");
        if o.status.success() {
            client = Some(stdout(&o));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let client = client.unwrap_or_else(|| panic!("{cmd} client never ran"));
    let o = server.wait_with_output().expect("the server ends");
    (stdout(&o), client)
}

/// `softverbs pingpong` prints its address and result lines as
/// `ibv_rc_pingpong` (run over softverbs' libibverbs.so.1) does.
#[test]
fn pingpong_lines_are_ibv_rc_pingpongs() {
    if Command::new("ibv_rc_pingpong").arg("-h").output().is_err() {
        println!("SKIP: ibv_rc_pingpong is not installed (apt-get install ibverbs-utils)");
        return;
    }
    let Some(dir) = library_dir("pingpong_libdir") else {
        return;
    };
    let port = (20000 + std::process::id() % 1000).to_string();
    let srv = ["-d", "softverbs_0", "-g", "0", "-n", "50", "-p", port.as_str()];
    let mut cli = srv.to_vec();
    cli.push("127.0.0.1");
    let (_, theirs) = pair("ibv_rc_pingpong", &srv, &cli, Some(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    let port = (21000 + std::process::id() % 1000).to_string();
    let srv = ["pingpong", "-n", "50", "-p", port.as_str()];
    let mut cli = srv.to_vec();
    cli.push("127.0.0.1");
    let (_, ours) = pair(env!("CARGO_BIN_EXE_softverbs"), &srv, &cli, None);
    // Up to the GID (its text has no fixed width), and the two result
    // lines, with every run of (hex) digits as one `#`: these figures are
    // not padded.
    let collapse = |l: &str| {
        let mut out = String::new();
        for c in l.chars() {
            if c.is_ascii_hexdigit() || c == '.' || c == 'x' {
                if !out.ends_with('#') {
                    out.push('#');
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let shape = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains("address:") || l.contains(" seconds = "))
            .map(|l| collapse(l.split(" GID ").next().expect("line")))
            .collect()
    };
    assert_eq!(shape(&ours), shape(&theirs), "ours:\n{ours}\ntheirs:\n{theirs}");
    // Both GIDs as inet_ntop writes them.
    for out in [&ours, &theirs] {
        let gid = out.lines().next().and_then(|l| l.split(" GID ").nth(1)).expect("a GID");
        assert!(
            gid.parse::<std::net::Ipv6Addr>().is_ok() && !gid.contains("0000"),
            "{gid}"
        );
    }
}

/// The options without effect are listed under their own heading, after
/// every option that has one.
#[test]
fn options_without_effect_come_last_in_help() {
    for (sub, last_real) in [("perf", "--plot <FILE.svg>"), ("pingpong", "--qp-timeout <N>")] {
        let help = stdout(&softverbs(&[sub, "--help"]));
        let heading = help.find("options without effect here").expect("the heading");
        let real = help.find(last_real).unwrap_or_else(|| panic!("{sub}: no {last_real}"));
        assert!(
            real < heading,
            "{sub}: {last_real} is under the heading of options without effect"
        );
    }
}

/// `--perform_warm_up` sends a tx depth's worth of unmeasured WRITEs
/// before the measured ones: the soft device's counters show them.
#[test]
fn a_warm_up_pass_precedes_the_measured_one() {
    let tx_packets = |extra: &[&str]| -> u64 {
        let mut args = vec![
            "--quiet", "perf", "write_bw", "-n", "20", "-s", "64", "-t", "32", "--stats",
        ];
        args.extend_from_slice(extra);
        let o = softverbs(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        out.lines()
            .filter_map(|l| l.trim().strip_prefix("tx_packets: "))
            .map(|n| n.parse::<u64>().expect("a count"))
            .max()
            .unwrap_or_else(|| panic!("no tx_packets in\n{out}"))
    };
    assert_eq!(tx_packets(&[]), 20);
    assert_eq!(tx_packets(&["--perform_warm_up"]), 20 + 32);
}
