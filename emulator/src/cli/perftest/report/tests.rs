use super::*;
use softverbs::verbs::Gid;

fn params(args: &[&str]) -> Params {
    crate::cli::perftest::args::testing::params(args).unwrap()
}

fn info(p: &Params) -> BannerInfo<'_> {
    BannerInfo {
        params: p,
        device: "softverbs_0",
        mtu: 4096,
        link_layer: LinkLayer::Ethernet,
        gid_index: 0,
        inline_size: 0,
        out_reads: 16,
        backend: "soft",
        placement: "inproc loopback softverbs_0 <-> softverbs_1".into(),
        client: true,
    }
}

#[test]
fn c_hex_like_printf() {
    assert_eq!(c_alt_hex(0, 4), "0000");
    assert_eq!(c_alt_hex(0x11, 6), "0x0011");
    assert_eq!(c_alt_hex(0x2fd5c1, 6), "0x2fd5c1");
    assert_eq!(c_alt_hex(0x1fe1ec, 8), "0x1fe1ec");
    assert_eq!(c_alt_hex(0x7f00_1234, 16), "0x0000007f001234");
}

#[test]
fn banner_and_addresses() {
    let p = params(&["write_bw"]);
    let b = banner(&info(&p));
    let lines: Vec<&str> = b.lines().collect();
    assert_eq!(lines[0], RESULT_LINE);
    assert_eq!(lines[1], "                    RDMA_Write BW Test");
    assert!(b.contains(" Dual-port       : OFF\t\tDevice         : softverbs_0\n"));
    assert!(b.contains(" Number of qps   : 1\t\tTransport type : IB\n"));
    assert!(b.contains(" Connection type : RC\t\tUsing SRQ      : OFF\n"));
    assert!(b.contains(" TX depth        : 128\n CQ Moderation   : 100\n"));
    assert!(b.contains(" Mtu             : 4096[B]\n Link type       : Ethernet\n"));
    assert!(b.contains(" Max inline data : 0[B]\n"));
    assert_eq!(*lines.last().unwrap(), RESULT_LINE);
    let p = params(&["atomic_lat", "-A", "CMP_AND_SWAP"]);
    let b = banner(&info(&p));
    assert!(b.contains("                    Atomic CMP_AND_SWAP Latency Test\n"));
    assert!(b.contains(" Outstand reads  : 16\n"));
    assert!(!b.contains("CQ Moderation"));
    let p = params(&["send_bw", "-b", "-l", "4", "-n", "400", "-e"]);
    let b = banner(&info(&p));
    assert!(b.contains("Send Bidirectional Post List BW Test\n"), "{b}");
    assert!(b.contains(" Test with events. Using softverbs_0_comp0\n"));
    assert!(b.contains(" RX depth        : 512\n"));

    let d = Dest {
        qpn: 0x11,
        psn: 0x2fd5c1,
        rkey: 0x1fe1ec,
        vaddr: 0x7f12_3456_7000,
        out_reads: 16,
        gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 127, 83, 86, 1]),
        ..Dest::default()
    };
    assert_eq!(
        address_lines("local", &d, VerbKind::Write, Connection::Rc),
        " local address: LID 0000 QPN 0x0011 PSN 0x2fd5c1 RKey 0x1fe1ec VAddr 0x007f1234567000\n \
         GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:83:86:01\n"
    );
    assert!(address_lines("remote", &d, VerbKind::Read, Connection::Rc).contains(" OUT 0x10 RKey"));
    assert!(!address_lines("remote", &d, VerbKind::Send, Connection::Rc).contains("RKey"));
}

#[test]
fn table_rows() {
    let r = BwResult {
        size: 65536,
        iters: 5000,
        peak_bps: 11002.18 * 1_048_576.0,
        avg_bps: 11000.01 * 1_048_576.0,
        msg_rate: 176_000.2,
    };
    assert_eq!(
        bw_row(&r, false),
        " 65536      5000             11002.18            11000.01\t\t   0.176000\n"
    );
    assert_eq!(bw_header(false), format!("{RESULT_FMT}\n"));
    assert!(bw_header(true).contains("BW peak[Gb/sec]"));
    let l = LatResult {
        size: 2,
        iters: 1000,
        t_min: 0.91,
        t_max: 4.5,
        t_typical: 0.95,
        t_avg: 0.97,
        t_stdev: 0.1,
        p99: 1.5,
        p99_9: 4.0,
    };
    assert_eq!(
        lat_row(&l, 2),
        " 2       1000          0.91           4.50         0.95     \t       0.97        \t0.10   \t\t1.50    \t\t4.00   \n"
    );
    // --digits 3: every latency figure to the nanosecond.
    assert_eq!(
        lat_row(&LatResult { t_typical: 0.2954, ..l }, 3),
        " 2       1000          0.910          4.500        0.295    \t       0.970       \t0.100  \t\t1.500   \t\t4.000  \n"
    );
    assert!(lat_header(false).starts_with(" #bytes #iterations    t_min[usec]"));
    let d = LatDurResult {
        size: 2,
        iters: 10,
        t_avg: 1.0,
        tps: 5.0,
    };
    assert_eq!(
        lat_dur_row(&d, 2),
        " 2             10            1.00           5.00   \n"
    );
    assert_eq!(
        lat_dur_row(&d, 3),
        " 2             10            1.000          5.00   \n"
    );
}

#[test]
fn output_values_as_perftest_prints_them() {
    use crate::cli::perftest::args::OutputKind;
    let r = Row::Bw(BwResult {
        size: 8,
        iters: 10,
        peak_bps: 2e9,
        avg_bps: 1_048_576.0 * 1234.5,
        msg_rate: 2_500_000.0,
    });
    assert_eq!(output_value(&r, OutputKind::Bandwidth, false), "1234.500000\n");
    assert_eq!(output_value(&r, OutputKind::MessageRate, false), "2.500000\n");
    let l = Row::LatDur(LatDurResult {
        size: 2,
        iters: 10,
        t_avg: 1.25,
        tps: 5.0,
    });
    assert_eq!(output_value(&l, OutputKind::Latency, false), "1.250000\n");
}

#[test]
fn json_report() {
    let p = params(&["write_bw", "--report_gbits"]);
    let r = BwResult {
        size: 8,
        iters: 10,
        peak_bps: 1e9,
        avg_bps: 5e8,
        msg_rate: 1e6,
    };
    let j = json(&info(&p), &[Row::Bw(r), Row::Bw(r)]);
    assert!(j.starts_with("{\n\"test_info\": {\n\"test\": \"RDMA_Write_BW_Test\",\n"));
    assert!(
        j.contains("\"BW_peak\": 8.00,\n\"BW_average\": 4.00,\n\"MsgRate\": 1.000000"),
        "{j}"
    );
    assert_eq!(j.matches("\"MsgSize\": 8").count(), 2);
    assert!(j.trim_end().ends_with("]\n}"));
    assert_eq!(json_str("a\"b\\"), "\"a\\\"b\\\\\"");
}

// The comparison table (`--compare`).

fn bw(size: u64, mib: f64) -> Row {
    Row::Bw(BwResult {
        size,
        iters: 10,
        peak_bps: mib * 1_048_576.0,
        avg_bps: mib * 1_048_576.0,
        msg_rate: 1.0,
    })
}

#[test]
fn ratios_are_each_backend_over_the_first() {
    let t = comparison(
        &[
            ("soft", vec![bw(64, 100.0), bw(4096, 400.0)]),
            ("hw", vec![bw(64, 250.0)]),
        ],
        false,
    );
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[1].contains("soft BW") && lines[1].contains("hw/soft"), "{t}");
    assert!(lines[1].contains("MB/sec"), "{t}");
    let r64 = lines
        .iter()
        .find(|l| l.trim_start().starts_with("64 "))
        .expect("64-byte row");
    assert!(
        r64.contains("100.00") && r64.contains("250.00") && r64.ends_with("2.50x"),
        "{t}"
    );
    // A size only one backend ran has no ratio.
    let r4k = lines
        .iter()
        .find(|l| l.trim_start().starts_with("4096"))
        .expect("4096-byte row");
    assert!(r4k.contains("400.00") && r4k.trim_end().ends_with('-'), "{t}");
}

#[test]
fn latency_compares_the_typical_latency() {
    let lat = |size, t| {
        Row::Lat(LatResult {
            size,
            iters: 10,
            t_min: 0.5,
            t_max: 9.0,
            t_typical: t,
            t_avg: 1.0,
            t_stdev: 0.1,
            p99: 2.0,
            p99_9: 3.0,
        })
    };
    let t = comparison(&[("soft", vec![lat(8, 4.0)]), ("hw", vec![lat(8, 1.0)])], false);
    assert!(t.contains("t_typical[usec]"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.trim_start().starts_with("8 ") && l.ends_with("0.25x")),
        "{t}"
    );
}
