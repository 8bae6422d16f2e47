//! The plot of `sluice bench latency`: p50 and p99 latency (log scale) against publish rate, for the raw
//! client and sluice, unordered and ordered (an SVG; text is left to the viewer's fonts).

use crate::latency_points::RatePoint;
use plotters::prelude::*;
use std::path::Path;

/// One line of the plot: its label, colour, dash, and value per point.
type Series = (&'static str, RGBColor, bool, fn(&RatePoint) -> f64);

/// Writes the plot of `points` to `path` (its folder created if missing).
pub(crate) fn draw(path: &Path, points: &[RatePoint]) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let series: [Series; 6] = [
        (
            "raw client p99, unordered",
            RGBColor(120, 120, 120),
            true,
            |p| p.unordered[0].p99,
        ),
        (
            "raw client p99, ordered",
            RGBColor(190, 190, 190),
            true,
            |p| p.ordered[0].p99,
        ),
        ("sluice p50, unordered", RGBColor(31, 119, 180), true, |p| {
            p.unordered[1].p50
        }),
        (
            "sluice p99, unordered",
            RGBColor(31, 119, 180),
            false,
            |p| p.unordered[1].p99,
        ),
        ("sluice p50, ordered", RGBColor(214, 39, 40), true, |p| {
            p.ordered[1].p50
        }),
        ("sluice p99, ordered", RGBColor(214, 39, 40), false, |p| {
            p.ordered[1].p99
        }),
    ];
    let max_rate = points.iter().map(|p| p.rate).max().unwrap_or(1);
    // Logarithmic: a saturated emulator's seconds beside the tens of milliseconds below it.
    let values = points
        .iter()
        .flat_map(|p| series.iter().map(move |s| (s.3)(p)));
    let top = values.clone().fold(250.0f64, f64::max) * 1.5;
    let bottom = values.fold(250.0f64, f64::min).max(1.0) / 1.5;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "publish-to-commit latency on the emulator",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..f64::from(max_rate) * 1.05, (bottom..top).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("publish rate, msg/s")
        .y_desc("latency, ms (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    let bar = [(0.0, 250.0), (f64::from(max_rate) * 1.05, 250.0)];
    chart
        .draw_series(LineSeries::new(bar, BLACK.mix(0.4).stroke_width(1)))
        .map_err(|e| e.to_string())?
        .label("bar: p99 250 ms at 5k msg/s, unordered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    for (label, colour, dashed, value) in series {
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (f64::from(p.rate), value(p)))
            .collect();
        let style = colour.stroke_width(if dashed { 1 } else { 3 });
        chart
            .draw_series(LineSeries::new(line.clone(), style))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                line.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
