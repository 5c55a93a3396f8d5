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
mod tests;
