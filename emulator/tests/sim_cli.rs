//! `softverbs sim`: run, fuzz and bench through the built binary.

use std::process::{Command, Output};

fn softverbs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softverbs"))
        .args(args)
        .output()
        .expect("run the softverbs binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn sim_run_replays_a_seed_with_its_trace() {
    let o = softverbs(&[
        "--no-embedded",
        "sim",
        "run",
        "--seed",
        "0x2b",
        "--trace",
        "--tail",
        "5",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.starts_with("seed 0x2b: "), "{out}");
    assert!(out.contains("earlier events not shown"), "{out}");
    assert!(out.lines().last().unwrap().starts_with("ok: "), "{out}");
    // Same seed, same run.
    assert_eq!(
        stdout(&softverbs(&["--no-embedded", "sim", "run", "--seed", "43"])),
        stdout(&softverbs(&["--no-embedded", "sim", "run", "--seed", "0x2b"]))
    );
}

#[test]
fn sim_fuzz_and_bench() {
    let o = softverbs(&["--no-embedded", "sim", "fuzz", "--count", "5", "--permanent-cut"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("0 of 5 scenarios failed"));
    let o = softverbs(&["--no-embedded", "sim", "bench", "-n", "10", "--loss", "0,1"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    let rows: Vec<_> = out
        .lines()
        .filter(|l| l.starts_with("write") || l.starts_with("send"))
        .collect();
    // Both recoveries side by side: 2 ops × 2 losses × gbn and sr.
    assert_eq!(rows.len(), 8, "{out}");
    assert!(out.contains("goodput"));
    assert_eq!(
        rows.iter()
            .filter(|l| l.split_whitespace().nth(1) == Some("sr"))
            .count(),
        4
    );
    let o = softverbs(&[
        "--no-embedded",
        "sim",
        "bench",
        "-n",
        "4",
        "--loss",
        "1",
        "--recovery",
        "gbn",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    let rows: Vec<_> = out
        .lines()
        .filter(|l| l.starts_with("write") || l.starts_with("send"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows.iter().all(|l| l.split_whitespace().nth(1) == Some("gbn")), "{out}");
    let o = softverbs(&["--no-embedded", "sim", "bench", "--recovery", "tcp"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn sim_rejects_a_bad_seed() {
    let o = softverbs(&["--no-embedded", "sim", "run", "--seed", "banana"]);
    assert_eq!(o.status.code(), Some(2));
}
