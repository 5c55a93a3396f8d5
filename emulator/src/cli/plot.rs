//! Charts as SVG files: `softverbs perf <test> -a --plot FILE.svg`
//! (bandwidth or latency against message size, one line per backend) and
//! `softverbs sim bench --plot FILE.svg` (goodput and p99 latency against
//! loss).
//!
//! Drawn with `plotters`' SVG backend and no font backend: text goes into
//! the file as SVG `<text>` elements (the viewer picks the font) and
//! plotters sizes it with its built-in estimate, so the build needs no
//! system font library. Each line is a `<polyline>`; the legend names it.

use std::fmt;
use std::path::Path;

use crate::cli::perftest::report::Row;
use crate::cli::perftest::stats::BwResult;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::sim::bench::BenchRow;

/// A failed plot: the file could not be written or the data has nothing
/// to draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotError(pub String);

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlotError {}

fn err(path: &Path) -> impl Fn(&dyn fmt::Display) -> PlotError + '_ {
    move |e| PlotError(format!("plot {}: {e}", path.display()))
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its points `(x, y)`, in x order.
    pub points: Vec<(f64, f64)>,
}

/// How an axis is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear from 0 (or the smallest value, if negative).
    Linear,
    /// Logarithmic, ticks at powers of 10 (values must be positive;
    /// others are left out).
    Log,
    /// Logarithmic, ticks at powers of 2 (message sizes).
    Log2,
}

/// One panel: a title, axes and lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The caption above the panel.
    pub title: String,
    /// The x axis' description.
    pub x_label: String,
    /// The y axis' description.
    pub y_label: String,
    /// The x axis' scale.
    pub x_scale: Scale,
    /// The y axis' scale.
    pub y_scale: Scale,
    /// The lines.
    pub series: Vec<Series>,
}

/// Line colours, distinct and dark enough on white (the "Tableau 10"
/// set).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Width of the image, and height of one panel, in pixels.
const WIDTH: u32 = 900;
const PANEL_HEIGHT: u32 = 520;

/// Writes `charts` as panels one above the other into the SVG file `path`.
///
/// # Errors
///
/// [`PlotError`] when no chart has a point to draw, or the file cannot be
/// written.
pub fn write_svg(path: &Path, charts: &[Chart]) -> Result<(), PlotError> {
    let drawable = |c: &&Chart| c.series.iter().any(|s| !points(s, c).is_empty());
    if charts.is_empty() || !charts.iter().any(|c| drawable(&c)) {
        return Err(PlotError(format!("plot {}: no data to draw", path.display())));
    }
    let height = PANEL_HEIGHT * charts.len() as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path)(&e))?;
    let panels = root.split_evenly((charts.len(), 1));
    for (chart, area) in charts.iter().zip(panels.iter()) {
        draw_chart(area, chart).map_err(|e| err(path)(&e))?;
    }
    root.present().map_err(|e| err(path)(&e))?;
    Ok(())
}

/// The points of `s` the chart's scales can show.
fn points(s: &Series, c: &Chart) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .copied()
        .filter(|&(x, y)| {
            x.is_finite()
                && y.is_finite()
                && (c.x_scale == Scale::Linear || x > 0.0)
                && (c.y_scale == Scale::Linear || y > 0.0)
        })
        .collect()
}

/// The range of `values` on `scale`, widened so that a single value or a
/// flat line still has a visible axis.
fn range(values: impl Iterator<Item = f64>, scale: Scale) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    match scale {
        Scale::Linear => {
            lo = lo.min(0.0);
            if hi <= lo {
                hi = lo + 1.0;
            }
            lo..hi * 1.05
        }
        Scale::Log | Scale::Log2 => {
            if hi <= lo {
                hi = lo * 2.0;
            }
            lo / 1.2..hi * 1.2
        }
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_chart(area: &DrawingArea<SVGBackend<'_>, Shift>, c: &Chart) -> DrawResult {
    let pts: Vec<Vec<(f64, f64)>> = c.series.iter().map(|s| points(s, c)).collect();
    let xr = range(pts.iter().flatten().map(|p| p.0), c.x_scale);
    let yr = range(pts.iter().flatten().map(|p| p.1), c.y_scale);
    let log = |r: std::ops::Range<f64>, s: Scale| r.log_scale().base(if s == Scale::Log2 { 2.0 } else { 10.0 });
    match (c.x_scale, c.y_scale) {
        (Scale::Linear, Scale::Linear) => draw_on(area, c, &pts, xr, yr),
        (Scale::Linear, y) => draw_on(area, c, &pts, xr, log(yr, y)),
        (x, Scale::Linear) => draw_on(area, c, &pts, log(xr, x), yr),
        (x, y) => draw_on(area, c, &pts, log(xr, x), log(yr, y)),
    }
}

fn draw_on<X, Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    c: &Chart,
    pts: &[Vec<(f64, f64)>],
    x: X,
    y: Y,
) -> DrawResult
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .x_desc(c.x_label.as_str())
        .y_desc(c.y_label.as_str())
        .x_label_formatter(&|v| short_number(*v))
        .y_label_formatter(&|v| short_number(*v))
        .draw()?;
    for (i, (s, p)) in c.series.iter().zip(pts).enumerate() {
        let color = PALETTE[i % PALETTE.len()].to_rgba();
        chart
            .draw_series(LineSeries::new(p.iter().copied(), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        // Later lines get smaller markers: points that coincide stay
        // visible.
        let radius = 5u32.saturating_sub(i as u32).max(2);
        chart.draw_series(p.iter().map(|&pt| Circle::new(pt, radius, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// An axis label: `4K`, `8M` for powers of two from 1024, else up to
/// three significant decimals.
fn short_number(v: f64) -> String {
    let k = 1024.0;
    let pow2 = v >= k && v.fract() == 0.0 && (v as u64).is_power_of_two();
    if pow2 && v >= k * k {
        format!("{}M", v / (k * k))
    } else if pow2 {
        format!("{}K", v / k)
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The chart of `softverbs perf`: per run (a backend, named first), the
/// average bandwidth against message size for bandwidth rows (MB/sec of
/// 2^20 bytes, Gb/sec with `gbits`); typical and 99th-percentile latency
/// for latency rows; average latency for `-D` latency rows.
pub fn perf_chart(test: &str, runs: &[(&str, Vec<Row>)], gbits: bool) -> Chart {
    let bw = runs
        .iter()
        .flat_map(|(_, r)| r.first())
        .any(|r| matches!(r, Row::Bw(_)));
    let mut series = Vec::new();
    for (name, rows) in runs {
        if bw {
            let points = rows
                .iter()
                .filter_map(|r| match r {
                    Row::Bw(b) => Some((b.size as f64, BwResult::in_units(b.avg_bps, gbits))),
                    _ => None,
                })
                .collect();
            series.push(Series {
                name: format!("{name} BW average"),
                points,
            });
            continue;
        }
        let mut typical = Vec::new();
        let mut p99 = Vec::new();
        let mut avg = Vec::new();
        for r in rows {
            match r {
                Row::Lat(l) => {
                    typical.push((l.size as f64, l.t_typical));
                    p99.push((l.size as f64, l.p99));
                }
                Row::LatDur(l) => avg.push((l.size as f64, l.t_avg)),
                Row::Bw(_) => {}
            }
        }
        for (what, points) in [("t_typical", typical), ("99% percentile", p99), ("t_avg", avg)] {
            if !points.is_empty() {
                series.push(Series {
                    name: format!("{name} {what}"),
                    points,
                });
            }
        }
    }
    Chart {
        title: format!("softverbs perf {test}"),
        x_label: "message size [bytes]".to_string(),
        y_label: match (bw, gbits) {
            (true, false) => "BW average [MB/sec]",
            (true, true) => "BW average [Gb/sec]",
            (false, _) => "latency [usec]",
        }
        .to_string(),
        x_scale: Scale::Log2,
        y_scale: if bw { Scale::Linear } else { Scale::Log },
        series,
    }
}

/// The charts of `softverbs sim bench`: goodput (Gb/s) against loss (%),
/// then p99 completion latency (µs) against loss, one line per label of
/// `label` (the operation; a caller that varies more than the operation
/// names that too), points in loss order.
pub fn sim_charts(rows: &[BenchRow], label: impl Fn(&BenchRow) -> String) -> Vec<Chart> {
    let mut goodput: Vec<Series> = Vec::new();
    let mut p99: Vec<Series> = Vec::new();
    for r in rows {
        let name = label(r);
        let loss = r.loss * 100.0;
        let i = match goodput.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                goodput.push(Series {
                    name: name.clone(),
                    points: Vec::new(),
                });
                p99.push(Series {
                    name,
                    points: Vec::new(),
                });
                goodput.len() - 1
            }
        };
        goodput[i].points.push((loss, r.goodput_gbps));
        p99[i].points.push((loss, r.lat_p99_ns as f64 / 1e3));
    }
    for s in goodput.iter_mut().chain(p99.iter_mut()) {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let chart = |title: &str, y: &str, series| Chart {
        title: title.to_string(),
        x_label: "loss [%]".to_string(),
        y_label: y.to_string(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        series,
    };
    vec![
        chart("sim bench: goodput against loss", "goodput [Gb/s]", goodput),
        chart("sim bench: p99 completion latency against loss", "p99 [usec]", p99),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::perftest::stats::LatResult;

    fn bw(size: u64, mb: f64) -> Row {
        Row::Bw(BwResult {
            size,
            iters: 10,
            peak_bps: mb * 1_048_576.0,
            avg_bps: mb * 1_048_576.0,
            msg_rate: 1.0,
        })
    }

    #[test]
    fn a_bandwidth_chart_has_one_line_per_run() {
        let c = perf_chart(
            "write_bw",
            &[("soft", vec![bw(2, 1.0), bw(4, 2.0)]), ("hw", vec![bw(2, 3.0)])],
            false,
        );
        assert_eq!(c.series.len(), 2);
        assert_eq!(c.series[0].name, "soft BW average");
        assert_eq!(c.series[0].points, vec![(2.0, 1.0), (4.0, 2.0)]);
        assert_eq!(c.y_label, "BW average [MB/sec]");
        assert_eq!((c.x_scale, c.y_scale), (Scale::Log2, Scale::Linear));
    }

    #[test]
    fn a_latency_chart_has_typical_and_p99() {
        let l = Row::Lat(LatResult {
            size: 8,
            iters: 10,
            t_min: 1.0,
            t_max: 9.0,
            t_typical: 2.0,
            t_avg: 2.5,
            t_stdev: 0.1,
            p99: 5.0,
            p99_9: 8.0,
        });
        let c = perf_chart("send_lat", &[("soft", vec![l])], false);
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["soft t_typical", "soft 99% percentile"]);
        assert_eq!(c.series[1].points, vec![(8.0, 5.0)]);
    }

    #[test]
    fn ranges_and_labels() {
        assert_eq!(range([3.0].into_iter(), Scale::Linear), 0.0..3.0 * 1.05);
        assert_eq!(range([0.0].into_iter(), Scale::Linear), 0.0..1.05);
        let r = range([2.0, 2.0].into_iter(), Scale::Log);
        assert!(r.start < 2.0 && r.end > 4.0);
        assert_eq!(range(std::iter::empty(), Scale::Log), 0.0..1.0);
        assert_eq!(short_number(4096.0), "4K");
        assert_eq!(short_number(8_388_608.0), "8M");
        assert_eq!(short_number(12.34), "12.3");
        assert_eq!(short_number(32.0), "32");
        assert_eq!(short_number(0.5), "0.500");
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let dir = std::env::temp_dir().join(format!("sv_plot_empty_{}.svg", std::process::id()));
        let c = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Log,
            // Points a log scale cannot show.
            series: vec![Series {
                name: "s".into(),
                points: vec![(0.0, 1.0), (1.0, -1.0)],
            }],
        };
        assert!(write_svg(&dir, &[c]).is_err());
        assert!(write_svg(&dir, &[]).is_err());
        assert!(!dir.exists());
    }
}
