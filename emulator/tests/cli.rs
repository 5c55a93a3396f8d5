//! Runs the built `softverbs` binary and checks its output and exit status.

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

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails if the process panicked or died by a signal.
fn assert_clean(o: &Output) {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "the CLI panicked:\n{err}");
    assert!(o.status.code().is_some(), "killed by a signal: {:?}", o.status);
}

#[test]
fn devices_lists_the_embedded_default() {
    let o = softverbs(&["devices"]);
    assert_clean(&o);
    assert!(o.status.success(), "status {:?}, stderr:\n{}", o.status, stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("    device          \t   node GUID\tbackend"));
    assert_eq!(lines.next(), Some("    ------          \t----------------\t-------"));
    for name in ["softverbs_0", "softverbs_1"] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} not listed:\n{out}"));
        let cols: Vec<&str> = row.split('\t').collect();
        assert_eq!(cols.len(), 3, "{row:?}");
        assert_eq!(cols[1].len(), 16, "node GUID as 16 hex digits: {row:?}");
        assert!(cols[1].chars().all(|c| c.is_ascii_hexdigit()), "{row:?}");
        assert_eq!(cols[2], "soft");
    }
}

#[test]
fn devices_soft_backend_explicitly() {
    let o = softverbs(&["--backend", "soft", "devices"]);
    assert_clean(&o);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    assert!(stdout(&o).contains("softverbs_1"));
}

#[test]
fn help_for_every_subcommand() {
    let o = softverbs(&["--help"]);
    assert_clean(&o);
    assert!(o.status.success());
    let top = stdout(&o);
    assert!(top.starts_with("RDMA verbs in pure Rust"), "{top}");
    assert!(
        top.contains("Exit status (every subcommand):"),
        "exit codes documented in --help:\n{top}"
    );
    assert!(top.contains("--backend"));
    assert!(top.contains("--no-embedded"));

    for (sub, about) in [
        ("devices", "List RDMA devices"),
        ("devinfo", "Show device and port attributes"),
    ] {
        assert!(top.contains(about), "{sub} described in the top-level help");
        for args in [vec![sub, "--help"], vec!["help", sub], vec![sub, "-h"]] {
            let o = softverbs(&args);
            assert_clean(&o);
            assert!(o.status.success(), "{args:?}: {:?}", o.status);
            let h = stdout(&o);
            assert!(h.starts_with(about), "{args:?}:\n{h}");
            assert!(h.contains("Usage: softverbs"), "{args:?}:\n{h}");
        }
        let long = stdout(&softverbs(&[sub, "--help"]));
        assert!(
            long.contains("Exit status (every subcommand):"),
            "{sub} --help:\n{long}"
        );
    }
    let devinfo = stdout(&softverbs(&["devinfo", "--help"]));
    for opt in ["--ib-dev", "--ib-port", "--verbose", "--list"] {
        assert!(devinfo.contains(opt), "devinfo --help lacks {opt}");
    }
}

#[test]
fn version() {
    let o = softverbs(&["--version"]);
    assert!(o.status.success());
    assert!(stdout(&o).starts_with("softverbs "));
}

/// Whether the hardware backend is compiled into this build (the binary
/// and this test link the same `softverbs`, features unified).
fn hw_compiled() -> bool {
    softverbs::verbs::provider(softverbs::verbs::BackendKind::Hardware).is_ok()
}

#[test]
fn hw_backend_without_devices() {
    let o = softverbs(&["devices", "--backend", "hw"]);
    assert_clean(&o);
    if hw_compiled() && o.status.success() {
        // A machine with RDMA hardware: every row is a hw device.
        let out = stdout(&o);
        assert!(out.lines().skip(2).all(|l| l.ends_with("\thw")), "{out}");
        return;
    }
    assert_eq!(o.status.code(), Some(1), "documented status for no device");
    assert!(o.stdout.is_empty(), "nothing on stdout: {}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    assert!(
        err.starts_with("softverbs: No RDMA devices found (backend hw: "),
        "{err}"
    );
    if !hw_compiled() {
        // The default build: the line says how to get the backend.
        assert!(err.contains("--features hardware"), "{err}");
    }
}

#[test]
fn no_embedded_and_soft_only_finds_nothing() {
    let o = softverbs(&["--no-embedded", "--backend", "soft", "devices"]);
    assert_clean(&o);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("No RDMA devices found (backend soft: "), "{err}");
    assert!(err.contains("--no-embedded"), "{err}");
}

#[test]
fn devinfo_unknown_device_fails_cleanly() {
    let o = softverbs(&["devinfo", "-d", "nosuch"]);
    assert_clean(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("softverbs: "), "{err}");
    assert!(err.contains("'nosuch'"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec!["devinfo", "-i", "0"],
        vec!["--backend", "nosuch", "devices"],
        vec!["nosuch"],
        vec![],
    ] {
        let o = softverbs(&args);
        assert_clean(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn devinfo_list() {
    let o = softverbs(&["--backend", "soft", "devinfo", "-l"]);
    assert_clean(&o);
    assert!(o.status.success());
    assert_eq!(stdout(&o), "2 HCAs found:\n\tsoftverbs_0\n\tsoftverbs_1\n\n");
}

/// Whatever the state of the backends, `devinfo` reports instead of
/// panicking, and uses a documented status.
#[test]
fn devinfo_never_panics() {
    for args in [vec!["devinfo"], vec!["devinfo", "-v"], vec!["devinfo", "-i", "9"]] {
        let o = softverbs(&args);
        assert_clean(&o);
        let code = o.status.code().expect("exit code");
        assert!([0, 1, 3].contains(&code), "{args:?}: status {code}");
        if code != 0 {
            let err = stderr(&o);
            assert!(
                !err.is_empty() && err.lines().all(|l| l.starts_with("softverbs: ")),
                "{err}"
            );
        }
    }
}

#[test]
fn devinfo_soft_device() {
    let o = softverbs(&["devinfo", "-d", "softverbs_0", "-v"]);
    assert_clean(&o);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("hca_id:\tsoftverbs_0\n"), "{out}");
    for line in [
        "\ttransport:\t\t\tInfiniBand (0)",
        "\tbackend:\t\t\tsoft",
        "\tnode_guid:\t\t\t0253:7600:7f53:5601",
        "\tphys_port_cnt:\t\t\t1",
        "\t\tport:\t1",
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
        "\t\t\tlink_layer:\t\tEthernet",
        "\t\t\tGID[  0]:\t\t::ffff:127.83.86.1, RoCE v2",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    for key in ["max_qp:", "max_qp_wr:", "device_cap_flags:", "max_inline_data:"] {
        assert!(out.contains(key), "missing {key}");
    }

    let o = softverbs(&["devinfo"]);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    assert_eq!(stdout(&o).matches("hca_id:").count(), 2);

    let o = softverbs(&["devinfo", "-d", "softverbs_1", "-i", "2"]);
    assert_eq!(o.status.code(), Some(1), "a port that does not exist");
    assert!(stderr(&o).contains("port 2 does not exist"));
}
