//! perftest's output: the dashed banner, the address lines, the result
//! tables (the same format strings as perftest_parameters.h) and the JSON
//! report.

use std::fmt::Write as _;

use softverbs::verbs::LinkLayer;

use super::args::{Connection, Params, VerbKind};
use super::resources::Dest;
use super::stats::{BwResult, LatDurResult, LatResult};

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str = "---------------------------------------------------------------------------------------";

/// perftest 4.5's `RESULT_FMT`: its MB is 2^20 bytes (later perftest
/// releases print the same figure as MiB/sec).
pub const RESULT_FMT: &str = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// perftest's `RESULT_FMT_G`.
pub const RESULT_FMT_G: &str = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";
/// perftest's `RESULT_FMT_LAT`.
pub const RESULT_FMT_LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// perftest's `RESULT_FMT_LAT_DUR`.
pub const RESULT_FMT_LAT_DUR: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// C's `%#0Nx`: `0x`-prefixed, zero-padded to `width` characters in all,
/// and no prefix for zero.
pub fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{:#0width$x}", v)
    }
}

/// What the banner describes.
#[derive(Debug, Clone)]
pub struct BannerInfo<'a> {
    /// The run's parameters.
    pub params: &'a Params,
    /// Device name (local end).
    pub device: &'a str,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// GID index.
    pub gid_index: u8,
    /// Inline size granted.
    pub inline_size: u32,
    /// Outstanding reads.
    pub out_reads: u32,
    /// Backend name (`soft`).
    pub backend: &'a str,
    /// How the ends reach each other (`inproc loopback softverbs_0 <->
    /// softverbs_1`, `TCP to host:18515`).
    pub placement: String,
    /// Whether this end is the client (or both ends, in loopback).
    pub client: bool,
}

/// The test's title: `RDMA_Write BW Test`, `Atomic FETCH_AND_ADD BW Test`,
/// `Send Bidirectional Post List BW Test`, `RDMA_Read Latency Test`.
pub fn title(p: &Params) -> String {
    let mut t = p.verb.perftest_name().to_string();
    t.push(' ');
    if p.verb == VerbKind::Atomic {
        t.push_str(p.atomic_type.name());
        t.push(' ');
    }
    if p.bw {
        if p.duplex {
            t.push_str("Bidirectional ");
        }
        if p.post_list > 1 {
            t.push_str("Post List ");
        }
        t.push_str("BW ");
    } else {
        t.push_str("Latency ");
    }
    t.push_str("Test");
    t
}

/// perftest 4.5's banner (`ctx_print_test_info`), with the lines that do
/// not apply to a soft device left out (`PCIe relax order`) and two
/// softverbs lines added (backend and link, and where the ends are).
pub fn banner(b: &BannerInfo<'_>) -> String {
    let p = b.params;
    let mut s = String::new();
    let _ = writeln!(s, "{RESULT_LINE}");
    let _ = writeln!(s, "                    {}", title(p));
    if p.events {
        let _ = writeln!(s, " Test with events. Using {}_comp0", b.device);
    }
    let _ = writeln!(s, " Dual-port       : OFF\t\tDevice         : {}", b.device);
    let _ = writeln!(s, " Number of qps   : {}\t\tTransport type : IB", p.qps);
    let _ = writeln!(s, " Connection type : {}\t\tUsing SRQ      : OFF", p.connection.name());
    // The work requests go through post_send, not the ibv_wr_* API.
    let _ = writeln!(s, " ibv_wr* API     : OFF");
    let _ = writeln!(
        s,
        " Backend         : {}\t\tLink           : {}",
        b.backend,
        p.link.name()
    );
    let _ = writeln!(s, " Placement       : {}", b.placement);
    if b.client || p.duplex {
        let _ = writeln!(s, " TX depth        : {}", p.tx_depth);
    }
    if p.post_list > 1 {
        let _ = writeln!(s, " Post List       : {}", p.post_list);
    }
    if p.verb == VerbKind::Send && (!b.client || p.duplex || p.mode == super::Mode::Loopback) {
        let _ = writeln!(s, " RX depth        : {}", p.rx_depth);
    }
    if p.bw {
        let _ = writeln!(s, " CQ Moderation   : {}", p.cq_mod);
    }
    let _ = writeln!(s, " Mtu             : {}[B]", b.mtu);
    let ll = match b.link_layer {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::InfiniBand | LinkLayer::Unspecified => "IB",
    };
    let _ = writeln!(s, " Link type       : {ll}");
    let _ = writeln!(s, " GID index       : {}", b.gid_index);
    if matches!(p.verb, VerbKind::Read | VerbKind::Atomic) {
        let _ = writeln!(s, " Outstand reads  : {}", b.out_reads);
    } else {
        let _ = writeln!(s, " Max inline data : {}[B]", b.inline_size);
    }
    let _ = writeln!(s, " rdma_cm QPs\t : OFF");
    let method = if p.mode == super::Mode::Loopback {
        "in-process (loopback)"
    } else {
        "Ethernet"
    };
    let _ = writeln!(s, " Data ex. method : {method}");
    let _ = writeln!(s, "{RESULT_LINE}");
    s
}

/// One address line and its GID line (`ctx_print_pingpong_data`): `side`
/// is `local` or `remote`.
pub fn address_lines(side: &str, d: &Dest, verb: VerbKind, conn: Connection) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(u64::from(d.lid), 4),
        c_alt_hex(u64::from(d.qpn), 6),
        c_alt_hex(u64::from(d.psn), 6)
    );
    // perftest's switch falls through from READ to WRITE.
    if verb == VerbKind::Read {
        let _ = write!(s, " OUT {}", c_alt_hex(u64::from(d.out_reads), 4));
    }
    if matches!(verb, VerbKind::Read | VerbKind::Write) && conn != Connection::Ud {
        let _ = write!(
            s,
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(d.rkey), 8),
            c_alt_hex(d.vaddr, 16)
        );
    }
    s.push('\n');
    s.push_str(" GID: ");
    let g: Vec<String> = d.gid.0.iter().map(|b| format!("{b:02}")).collect();
    s.push_str(&g.join(":"));
    s.push('\n');
    s
}

/// The bandwidth table's header line (with its trailing newline).
pub fn bw_header(gbits: bool) -> String {
    format!("{}\n", if gbits { RESULT_FMT_G } else { RESULT_FMT })
}

/// One bandwidth row (perftest's `REPORT_FMT`).
pub fn bw_row(r: &BwResult, gbits: bool) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}\n",
        r.size,
        r.iters,
        BwResult::in_units(r.peak_bps, gbits),
        BwResult::in_units(r.avg_bps, gbits),
        r.msg_rate / 1e6
    )
}

/// The latency table's header line.
pub fn lat_header(duration: bool) -> String {
    format!("{}\n", if duration { RESULT_FMT_LAT_DUR } else { RESULT_FMT_LAT })
}

/// One latency row (perftest's `REPORT_FMT_LAT`), its figures with
/// `digits` decimal places (perftest's 2 unless `--digits`).
pub fn lat_row(r: &LatResult, digits: usize) -> String {
    format!(
        " {:<7} {}          {:<7.d$}        {:<7.d$}      {:<7.d$}  \t       {:<7.d$}     \t{:<7.d$}\t\t{:<7.d$} \t\t{:<7.d$}\n",
        r.size,
        r.iters,
        r.t_min,
        r.t_max,
        r.t_typical,
        r.t_avg,
        r.t_stdev,
        r.p99,
        r.p99_9,
        d = digits
    )
}

/// One `-D` latency row (perftest's `REPORT_FMT_LAT_DUR`), the average
/// with `digits` decimal places.
pub fn lat_dur_row(r: &LatDurResult, digits: usize) -> String {
    format!(
        " {:<7}       {}            {:<7.d$}        {:<7.2}\n",
        r.size,
        r.iters,
        r.t_avg,
        r.tps,
        d = digits
    )
}

/// `--output`: the one figure perftest prints for a row (`%lf`): average
/// bandwidth in the report's unit, message rate in Mpps, or average
/// latency in usec. A figure the row lacks (bandwidth of a latency row)
/// prints as 0, which the argument check prevents.
pub fn output_value(r: &Row, what: super::args::OutputKind, gbits: bool) -> String {
    use super::args::OutputKind;
    let v = match (r, what) {
        (Row::Bw(b), OutputKind::Bandwidth) => BwResult::in_units(b.avg_bps, gbits),
        (Row::Bw(b), OutputKind::MessageRate) => b.msg_rate / 1e6,
        (Row::Lat(l), OutputKind::Latency) => l.t_avg,
        (Row::LatDur(l), OutputKind::Latency) => l.t_avg,
        _ => 0.0,
    };
    format!("{v:.6}\n")
}

/// A result row of any kind, for the JSON report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// Bandwidth.
    Bw(BwResult),
    /// Latency.
    Lat(LatResult),
    /// `-D` latency.
    LatDur(LatDurResult),
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The JSON report: perftest's `test_info` object and its result fields,
/// with `results` an array of one object per message size.
pub fn json(b: &BannerInfo<'_>, rows: &[Row]) -> String {
    let p = b.params;
    let mut s = String::from("{\n\"test_info\": {\n");
    let _ = writeln!(s, "\"test\": {},", json_str(&title(p).replace(' ', "_")));
    let _ = writeln!(s, "\"Dual_port\": \"OFF\",\n\"Device\": {},", json_str(b.device));
    let _ = writeln!(s, "\"Number_of_qps\": {},\n\"Transport_type\": \"IB\",", p.qps);
    let _ = writeln!(
        s,
        "\"Connection_type\": \"{}\",\n\"Using_SRQ\": \"OFF\",",
        p.connection.name()
    );
    let _ = writeln!(
        s,
        "\"Backend\": {},\n\"Link\": \"{}\",",
        json_str(b.backend),
        p.link.name()
    );
    let _ = writeln!(s, "\"TX_depth\": {},", p.tx_depth);
    if p.post_list > 1 {
        let _ = writeln!(s, "\"Post_List\": {},", p.post_list);
    }
    if p.verb == VerbKind::Send {
        let _ = writeln!(s, "\"RX_depth\": {},", p.rx_depth);
    }
    if p.bw {
        let _ = writeln!(s, "\"CQ_Moderation\": {},", p.cq_mod);
    }
    let _ = writeln!(s, "\"Mtu\": {},", b.mtu);
    let ll = if b.link_layer == LinkLayer::Ethernet {
        "Ethernet"
    } else {
        "IB"
    };
    let _ = writeln!(s, "\"Link_type\": \"{ll}\",\n\"GID_index\": {},", b.gid_index);
    if matches!(p.verb, VerbKind::Read | VerbKind::Atomic) {
        let _ = writeln!(s, "\"Outstand_reads\": {},", b.out_reads);
    } else {
        let _ = writeln!(s, "\"Max_inline_data\": {},", b.inline_size);
    }
    let _ = writeln!(s, "\"rdma_cm_QPs\": \"OFF\",");
    let method = if p.mode == super::Mode::Loopback {
        "loopback"
    } else {
        "Ethernet"
    };
    let _ = writeln!(s, "\"Data_ex_method\": \"{method}\"\n}},");
    s.push_str("\"results\": [");
    for (i, r) in rows.iter().enumerate() {
        s.push_str(if i == 0 { "\n{\n" } else { ",\n{\n" });
        match r {
            Row::Bw(r) => {
                let unit = p.report_gbits;
                let _ = write!(
                    s,
                    "\"MsgSize\": {},\n\"n_iterations\": {},\n\"BW_peak\": {:.2},\n\"BW_average\": {:.2},\n\"MsgRate\": {:.6},\n\"BW_unit\": \"{}\"",
                    r.size,
                    r.iters,
                    BwResult::in_units(r.peak_bps, unit),
                    BwResult::in_units(r.avg_bps, unit),
                    r.msg_rate / 1e6,
                    if unit { "Gb/sec" } else { "MB/sec" }
                );
            }
            Row::Lat(r) => {
                let _ = write!(
                    s,
                    "\"MsgSize\": {},\n\"n_iterations\": {},\n\"t_min\": {:.2},\n\"t_max\": {:.2},\n\"t_typical\": {:.2},\n\"t_avg\": {:.2},\n\"t_stdev\": {:.2},\n\"percentile_99\": {:.2},\n\"percentile_99.9\": {:.2}",
                    r.size, r.iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p99_9
                );
            }
            Row::LatDur(r) => {
                let _ = write!(
                    s,
                    "\"MsgSize\": {},\n\"n_iterations\": {},\n\"t_avg\": {:.2},\n\"tps_average\": {:.2}",
                    r.size, r.iters, r.t_avg, r.tps
                );
            }
        }
        s.push_str("\n}");
    }
    s.push_str("\n]\n}\n");
    s
}

#[cfg(test)]
mod tests {
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
}

/// The figure a comparison puts side by side for `row`, and whether more
/// is better: average bandwidth (MiB/s, or Gb/s with `gbits`) for
/// bandwidth rows, typical latency (µs) for latency rows, average latency
/// for `-D` rows.
fn compared_figure(row: &Row, gbits: bool) -> (u64, f64, bool) {
    match row {
        Row::Bw(b) => (b.size, BwResult::in_units(b.avg_bps, gbits), true),
        Row::Lat(l) => (l.size, l.t_typical, false),
        Row::LatDur(l) => (l.size, l.t_avg, false),
    }
}

/// The side-by-side table of `softverbs perf --backends`: one line per
/// message size with each backend's figure (see the header), then the
/// ratio of every other backend to the first (`hw/soft 1.80x`: the second
/// backend's figure over the first's, so above 1 means more bandwidth or
/// more latency). A size a backend did not run shows `-`.
pub fn comparison(columns: &[(&str, Vec<Row>)], gbits: bool) -> String {
    let Some(first_rows) = columns.iter().find_map(|(_, r)| r.first()) else {
        return "no results to compare\n".to_string();
    };
    let (_, _, bw) = compared_figure(first_rows, gbits);
    let unit = match (bw, gbits) {
        (true, false) => "BW average[MB/sec]",
        (true, true) => "BW average[Gb/sec]",
        (false, _) => {
            if matches!(first_rows, Row::LatDur(_)) {
                "t_avg[usec]"
            } else {
                "t_typical[usec]"
            }
        }
    };
    let mut sizes: Vec<u64> = columns
        .iter()
        .flat_map(|(_, rows)| rows.iter().map(|r| compared_figure(r, gbits).0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut s = String::new();
    let _ = writeln!(s, "{RESULT_LINE}");
    let _ = write!(s, " {:<10}", "#bytes");
    for (name, _) in columns {
        let _ = write!(s, " {:>16}", format!("{name} {}", if bw { "BW" } else { "lat" }));
    }
    let base = columns.first().map_or("", |c| c.0);
    for (name, _) in columns.iter().skip(1) {
        let _ = write!(s, " {:>12}", format!("{name}/{base}"));
    }
    let _ = writeln!(s, "    ({unit})");
    for size in sizes {
        let figure = |rows: &Vec<Row>| {
            rows.iter()
                .map(|r| compared_figure(r, gbits))
                .find(|(sz, _, _)| *sz == size)
                .map(|(_, v, _)| v)
        };
        let values: Vec<Option<f64>> = columns.iter().map(|(_, rows)| figure(rows)).collect();
        let _ = write!(s, " {size:<10}");
        for v in &values {
            match v {
                Some(v) => {
                    let _ = write!(s, " {v:>16.2}");
                }
                None => {
                    let _ = write!(s, " {:>16}", "-");
                }
            }
        }
        for v in values.iter().skip(1) {
            match (values[0], v) {
                (Some(b), Some(v)) if b > 0.0 => {
                    let _ = write!(s, " {:>12}", format!("{:.2}x", v / b));
                }
                _ => {
                    let _ = write!(s, " {:>12}", "-");
                }
            }
        }
        s.push('\n');
    }
    let _ = writeln!(s, "{RESULT_LINE}");
    s
}

#[cfg(test)]
mod comparison_tests {
    use super::*;

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
}
