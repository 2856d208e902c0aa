//! The scenario chart: QPS, average response time and per-node CPU over time, one panel each,
//! phases laid end to end with their labels. PNG through plotters' bitmap backend with the
//! bundled DejaVu Sans font (no system font lookup), SVG if PNG encoding fails.

use super::ScenarioReport;
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// DejaVu Sans 2.37 from Debian's fonts-dejavu-core (Bitstream Vera license, see assets/).
static FONT_TTF: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
pub const CHART_SIZE_PX: (u32, u32) = (1200, 1050);
const FONT: &str = "sans-serif";
/// Phase labels closer than this fraction of the x range to the previous label are skipped.
const LABEL_GAP_FRACTION_MIN: f64 = 0.04;

fn register_font() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, FONT_TTF).is_ok())
}

/// One plotted line: name and (seconds, value) points, one segment per phase so a line does
/// not bridge a phase without samples (e.g. write latency across a read-only mix).
struct Series {
    name: String,
    segments: Vec<Vec<(f64, f64)>>,
    color: RGBColor,
}

impl Series {
    fn new(name: String, color: RGBColor) -> Series {
        Series { name, segments: Vec::new(), color }
    }
    fn start_segment(&mut self) {
        if self.segments.last().is_none_or(|s| !s.is_empty()) {
            self.segments.push(Vec::new());
        }
    }
    fn push(&mut self, p: (f64, f64)) {
        if self.segments.is_empty() {
            self.segments.push(Vec::new());
        }
        if let Some(seg) = self.segments.last_mut() {
            seg.push(p);
        }
    }
    fn points(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.segments.iter().flatten()
    }
}

const COLORS: [RGBColor; 6] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(255, 127, 14), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];

/// The report's timelines laid end to end: (series per panel, phase boundaries).
struct Layout {
    qps: Vec<Series>,
    latency: Vec<Series>,
    cpu: Vec<Series>,
    boundaries: Vec<(f64, String)>,
    x_max: f64,
}

fn layout(report: &ScenarioReport) -> Layout {
    let node_names = report.phases.first().map(|p| p.node_names.clone()).unwrap_or_default();
    let mut qps = Series::new("QPS".into(), COLORS[0]);
    let mut read = Series::new("read avg (ms)".into(), COLORS[0]);
    let mut write = Series::new("write avg (ms)".into(), COLORS[1]);
    let mut cpu: Vec<Series> = node_names.iter().enumerate().map(|(i, n)| Series::new(format!("{n} CPU (%)"), COLORS[i % COLORS.len()])).collect();
    let mut offset = 0.0;
    let mut boundaries = Vec::new();
    for p in &report.phases {
        boundaries.push((offset, p.label.clone()));
        for series in [&mut qps, &mut read, &mut write].into_iter().chain(cpu.iter_mut()) {
            series.start_segment();
        }
        for s in &p.timeline {
            let x = offset + s.elapsed_s;
            qps.push((x, s.ops_per_s));
            if let Some(r) = s.read_latency_us_avg {
                read.push((x, r / 1000.0));
            }
            if let Some(w) = s.write_latency_us_avg {
                write.push((x, w / 1000.0));
            }
            for (series, c) in cpu.iter_mut().zip(&s.cpu_percent) {
                series.push((x, *c));
            }
        }
        offset += p.timeline.last().map(|s| s.elapsed_s).unwrap_or(0.0);
    }
    Layout { qps: vec![qps], latency: vec![read, write], cpu, boundaries, x_max: offset.max(1.0) }
}

fn y_max(series: &[Series]) -> f64 {
    let m = series.iter().flat_map(|s| s.points().map(|p| p.1)).fold(0.0, f64::max);
    if m <= 0.0 {
        1.0
    } else {
        m * 1.1
    }
}

fn panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, y_desc: &str, y_decimals: usize, series: &[Series], l: &Layout) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let y_top = y_max(series);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..l.x_max, 0f64..y_top)
        .map_err(|e| anyhow!("chart: {e:?}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.y_decimals$}"))
        .label_style((FONT, 13))
        .draw()
        .map_err(|e| anyhow!("mesh: {e:?}"))?;
    let mut last_label_x = f64::NEG_INFINITY;
    for (x, label) in &l.boundaries {
        chart.draw_series(std::iter::once(PathElement::new(vec![(*x, 0.0), (*x, y_top)], BLACK.mix(0.25)))).map_err(|e| anyhow!("boundary: {e:?}"))?;
        // A phase too short for its label (a quick load) stays unlabelled rather than overprint.
        if *x - last_label_x >= l.x_max * LABEL_GAP_FRACTION_MIN {
            chart
                .draw_series(std::iter::once(Text::new(label.clone(), (*x + l.x_max * 0.004, y_top * 0.97), (FONT, 13))))
                .map_err(|e| anyhow!("label: {e:?}"))?;
            last_label_x = *x;
        }
    }
    for s in series.iter().filter(|s| s.points().next().is_some()) {
        let color = s.color;
        for (i, seg) in s.segments.iter().filter(|seg| !seg.is_empty()).enumerate() {
            let drawn = chart.draw_series(LineSeries::new(seg.iter().copied(), color.stroke_width(2))).map_err(|e| anyhow!("series: {e:?}"))?;
            if i == 0 {
                drawn.label(s.name.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| anyhow!("legend: {e:?}"))?;
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, l: &Layout) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow!("fill: {e:?}"))?;
    let areas = root.split_evenly((3, 1));
    panel(&areas[0], "Throughput", "ops/s", 0, &l.qps, l)?;
    panel(&areas[1], "Average response time", "ms", 2, &l.latency, l)?;
    panel(&areas[2], "CPU utilisation", "% of one core", 0, &l.cpu, l)?;
    root.present().map_err(|e| anyhow!("write chart: {e:?}"))?;
    Ok(())
}

/// Writes chart.png (chart.svg as fallback) into `out`; None when there is nothing to plot
/// or no chart could be written (the report then omits it).
pub fn write_chart(report: &ScenarioReport, out: &Path) -> Result<Option<PathBuf>> {
    if report.phases.iter().all(|p| p.timeline.is_empty()) {
        return Ok(None);
    }
    if !register_font() {
        eprintln!("chart: the bundled font did not load; no chart written");
        return Ok(None);
    }
    let l = layout(report);
    let png = out.join("chart.png");
    match draw(BitMapBackend::new(&png, CHART_SIZE_PX).into_drawing_area(), &l) {
        Ok(()) => return Ok(Some(png)),
        Err(e) => eprintln!("chart: PNG failed ({e}); writing SVG"),
    }
    let svg = out.join("chart.svg");
    draw(SVGBackend::new(&svg, CHART_SIZE_PX).into_drawing_area(), &l)?;
    Ok(Some(svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::TimelineSample;
    use crate::scenario::PhaseTimeline;

    #[test]
    fn writes_a_png() {
        let samples = |n: usize, q: f64| -> Vec<TimelineSample> {
            (1..=n)
                .map(|i| TimelineSample {
                    elapsed_s: i as f64,
                    ops_per_s: q + i as f64,
                    read_latency_us_avg: Some(500.0),
                    write_latency_us_avg: Some(900.0),
                    latency_us_avg: Some(700.0),
                    cpu_percent: vec![80.0],
                })
                .collect()
        };
        let report = ScenarioReport {
            phases: vec![
                PhaseTimeline { label: "100:0".into(), timeline: samples(5, 1000.0), node_names: vec!["shoal".into()] },
                PhaseTimeline { label: "50:50".into(), timeline: samples(5, 600.0), node_names: vec!["shoal".into()] },
            ],
            ..ScenarioReport::default()
        };
        let dir = std::env::temp_dir().join(format!("shoal-chart-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = write_chart(&report, &dir).expect("chart").expect("written");
        let bytes = std::fs::read(&path).expect("read chart");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 10_000, "chart has content: {} bytes", bytes.len());
        let l = layout(&report);
        assert_eq!(l.boundaries, vec![(0.0, "100:0".to_string()), (5.0, "50:50".to_string())]);
        assert_eq!(l.qps[0].points().count(), 10);
        assert_eq!(l.qps[0].segments.len(), 2, "one line segment per phase");
        assert_eq!(l.latency[1].segments[0][0], (1.0, 0.9));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(write_chart(&ScenarioReport::default(), Path::new("/nonexistent")).expect("empty").is_none());
    }
}
