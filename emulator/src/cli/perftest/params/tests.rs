use super::*;
use crate::cli::perftest::args::testing::{params, try_parse};

fn parse(args: &[&str]) -> PerfArgs {
    try_parse(args).expect("parse")
}

#[test]
fn perftest_defaults() {
    let p = params(&["write_bw"]).unwrap();
    assert_eq!(
        (p.sizes.clone(), p.iters, p.tx_depth, p.cq_mod, p.inline_size),
        (vec![65536], 5000, 128, 100, 0)
    );
    assert_eq!(p.mode, Mode::Loopback);
    assert!(p.peak);
    let p = params(&["write_lat"]).unwrap();
    assert_eq!(
        (p.sizes.clone(), p.iters, p.tx_depth, p.inline_size),
        (vec![2], 1000, 1, 220)
    );
    let p = params(&["send_lat", "-c", "UD"]).unwrap();
    assert_eq!(p.inline_size, 188);
    let p = params(&["send_bw"]).unwrap();
    assert_eq!(p.rx_depth, 512);
    let p = params(&["atomic_bw"]).unwrap();
    assert_eq!((p.sizes.clone(), p.atomic_type), (vec![8], AtomicType::FetchAndAdd));
}

#[test]
fn perftest_flags() {
    let a = parse(&[
        "send_bw",
        "-s",
        "4096",
        "-n",
        "100",
        "-t",
        "64",
        "-r",
        "256",
        "-Q",
        "8",
        "-I",
        "64",
        "-c",
        "UC",
        "-q",
        "4",
        "-b",
        "-m",
        "1024",
        "-e",
        "--report_gbits",
        "--out_json",
        "x.json",
        "-d",
        "softverbs_1",
        "-x",
        "0",
    ]);
    let p = Params::from_args(&a, BackendKind::Soft).unwrap();
    assert_eq!(p.sizes, vec![4096]);
    assert_eq!(
        (p.iters, p.tx_depth, p.rx_depth, p.cq_mod, p.inline_size),
        (100, 64, 256, 8, 64)
    );
    assert_eq!(
        (p.connection, p.qps, p.duplex, p.mtu),
        (Connection::Uc, 4, true, Some(Mtu::Mtu1024))
    );
    assert!(p.events && p.report_gbits);
    assert_eq!(p.out_json.as_deref(), Some("x.json"));
    assert_eq!(p.ib_dev.as_deref(), Some("softverbs_1"));
    let p = params(&["write_bw", "--out_json"]).unwrap();
    assert_eq!(p.out_json.as_deref(), Some("perftest_out.json"));
    let p = params(&["write_bw", "-a"]).unwrap();
    assert_eq!(p.sizes.len(), 23);
    assert_eq!((p.sizes[0], p.sizes[22]), (2, 1 << 23));
    let p = params(&["write_bw", "-l", "8", "-n", "80"]).unwrap();
    assert_eq!((p.post_list, p.cq_mod), (8, 8));
    let p = params(&["read_bw", "-D", "3"]).unwrap();
    assert_eq!(p.duration, Some(3));
    assert!(!p.peak);
    assert!(p.margin <= 0.75);
    let p = params(&["write_bw", "-n", "30000"]).unwrap();
    assert!(!p.peak);
}

#[test]
fn modes_and_links() {
    assert_eq!(
        Params::from_args(&parse(&["write_bw", "--client", "h"]), BackendKind::Hardware)
            .unwrap()
            .mode,
        Mode::Client("h".into())
    );
    assert_eq!(
        Params::from_args(&parse(&["write_bw", "h2"]), BackendKind::Hardware)
            .unwrap()
            .mode,
        Mode::Client("h2".into())
    );
    assert_eq!(
        Params::from_args(&parse(&["write_bw", "--server"]), BackendKind::Hardware)
            .unwrap()
            .mode,
        Mode::Server
    );
    assert!(matches!(params(&["write_bw", "--server"]), Err(PerfError::Usage(_))));
    assert_eq!(params(&["write_bw", "--link", "udp"]).unwrap().link, LinkKind::Udp);
    assert_eq!(
        params(&["write_bw", "--link", "udp", "--server"]).unwrap().mode,
        Mode::Server
    );
    assert_eq!(params(&["write_bw", "--link", "shm"]).unwrap().link, LinkKind::Shm);
}

#[test]
fn recovery_and_injected_loss() {
    let p = params(&["write_bw", "--link", "udp"]).unwrap();
    assert_eq!((p.recovery, p.drop), (Recovery::SelectiveRepeat, None));
    let p = params(&["write_bw", "--link", "udp", "--recovery", "gbn", "--drop", "0.01"]).unwrap();
    assert_eq!((p.recovery, p.drop), (Recovery::GoBackN, Some(0.01)));
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    for bad in ["1.5", "-0.1", "NaN"] {
        let flag = format!("--drop={bad}");
        assert!(
            matches!(params(&["write_bw", "--link", "udp", &flag]), Err(PerfError::Usage(_))),
            "{bad}"
        );
    }
    // Where they cannot apply they are said to be ignored.
    let p = params(&["write_bw", "--recovery", "gbn", "--drop", "0.01"]).unwrap();
    assert_eq!(p.drop, None);
    assert!(p.notes.iter().any(|n| n.starts_with("--drop ignored")), "{:?}", p.notes);
    assert!(
        p.notes.iter().any(|n| n.starts_with("--recovery ignored")),
        "{:?}",
        p.notes
    );
    let p = params(&["write_bw", "--link", "shm", "--drop", "0.01"]).unwrap();
    assert_eq!(p.drop, None);
    assert!(try_parse(&["write_bw", "--recovery", "irn"]).is_err());
}

#[test]
fn rejected_combinations() {
    for bad in [
        &["read_bw", "-c", "UC"][..],
        &["write_bw", "-c", "UD"],
        &["atomic_lat", "-s", "16"],
        &["write_bw", "-n", "3"],
        &["write_bw", "-m", "1000"],
        &["write_lat", "-b"],
        &["write_lat", "-e"],
        &["write_bw", "-s", "0"],
        &["write_bw", "-l", "3", "-n", "100"],
    ] {
        assert!(matches!(params(bad), Err(PerfError::Usage(_))), "{bad:?}");
    }
    assert!(try_parse(&["write_bw", "-D", "2", "-n", "10"]).is_err());
}

#[test]
fn last_flag_wins_and_values_are_not_clamped_silently() {
    let p = params(&["write_bw", "-s", "64", "-s", "128", "-q", "2", "-q", "3"]).unwrap();
    assert_eq!((p.sizes.clone(), p.qps), (vec![128], 3));
    for zero in ["-t", "-r", "-Q", "-D"] {
        assert!(try_parse(&["send_bw", zero, "0"]).is_err(), "{zero} 0");
    }
    // perftest's adjustments happen, and are said.
    let p = params(&["write_bw", "-t", "8", "-Q", "32"]).unwrap();
    assert_eq!(p.cq_mod, 8);
    assert_eq!(
        p.notes,
        ["-Q 32 lowered to the tx depth 8 (a CQE at least once per queue)"]
    );
    let p = params(&["write_bw", "-l", "4", "-Q", "2", "-n", "40"]).unwrap();
    assert_eq!(p.cq_mod, 4);
    assert!(p.notes[0].starts_with("-Q 2 replaced by 4"), "{:?}", p.notes);
    let p = params(&["read_lat", "-Q", "5"]).unwrap();
    assert_eq!(p.cq_mod, 1);
    assert_eq!(p.notes, ["-Q 5 ignored: read_lat signals every WR"]);
    let p = params(&["write_bw", "-D", "3"]).unwrap();
    assert_eq!(p.margin, 0.75);
    assert!(
        p.notes[0].starts_with("-f 2: margin lowered to 0.75 s"),
        "{:?}",
        p.notes
    );
    let p = params(&["atomic_bw", "-a"]).unwrap();
    assert_eq!((p.sizes.clone(), p.notes.len()), (vec![8], 1));
    // Defaults adapted without a flag given say nothing.
    assert!(params(&["write_bw", "-t", "8"]).unwrap().notes.is_empty());
}

#[test]
fn flags_without_effect_are_named() {
    let p = params(&["write_bw", "-S", "3", "-R", "--use-srq", "--tclass=96", "-F"]).unwrap();
    let flags: Vec<&str> = p.notes.iter().map(|n| n.split(" ignored: ").next().unwrap()).collect();
    assert_eq!(flags, ["-S 3", "-R", "--use-srq", "--tclass 96"]);
    assert!(
        params(&["write_bw", "-F"]).unwrap().notes.is_empty(),
        "-F has its meaning"
    );
}

#[test]
fn perftest_modes_with_an_effect() {
    let p = params(&[
        "write_bw",
        "--output",
        "message_rate",
        "-w",
        "5",
        "-y",
        "0.5",
        "--reversed",
    ])
    .unwrap();
    assert_eq!(p.output, Some(OutputKind::MessageRate));
    assert_eq!((p.limit_bw, p.limit_msgrate, p.reversed), (Some(5.0), Some(0.5), true));
    assert!(matches!(
        params(&["write_lat", "--output", "bandwidth"]),
        Err(PerfError::Usage(_))
    ));
    assert!(matches!(
        params(&["write_bw", "--output", "latency"]),
        Err(PerfError::Usage(_))
    ));
    assert!(matches!(
        params(&["write_bw", "--reversed", "--link", "udp", "--server"]),
        Err(PerfError::Usage(_))
    ));
    assert!(try_parse(&["write_bw", "--run_infinitely"]).is_err(), "needs -D");
    assert!(try_parse(&["write_bw", "--run_infinitely", "-D", "2"]).is_ok());
    let p = params(&["write_bw", "--perform_warm_up", "-t", "16", "-l", "4", "-n", "40"]).unwrap();
    assert!(p.warm_up && p.notes.is_empty(), "{:?}", p.notes);
    let w = p.warm_up_params();
    assert_eq!((w.iters, w.peak, w.duration, w.warm_up), (16, false, None, false));
    let p = params(&["send_bw", "--perform_warm_up"]).unwrap();
    assert!(!p.warm_up && p.notes[0].starts_with("--perform_warm_up ignored: "));
    let p = params(&["write_bw", "--out_json", "--out_json_file", "r.json"]).unwrap();
    assert_eq!(p.out_json.as_deref(), Some("r.json"));
}
