//! The picture of a bench run: every request's TTFT and end-to-end latency against the
//! time it started, the P99 of each drift window as a line over them, failures as red
//! crosses on the time axis, and the run's headline figures in the title.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::loadgen::report::P99Drift;
use crate::loadgen::RequestRecord;

/// Draws the legend of `chart` at `position` on a light box and writes out the picture.
pub(crate) fn finish<'b>(
    chart: &mut ChartContext<'b, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    root: &DrawingArea<SVGBackend<'b>, Shift>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// The picture of `records` with their `drift` windows, as SVG; `title` heads it.
pub fn bench_svg(title: &str, records: &[RequestRecord], drift: &P99Drift) -> Result<String, String> {
    let mut out = String::new();
    draw(&mut out, title, records, drift).map_err(|e| format!("cannot draw the bench picture: {e}"))?;
    Ok(out)
}

fn draw<'a>(
    out: &'a mut String,
    title: &str,
    records: &[RequestRecord],
    drift: &P99Drift,
) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
    let x1 = records.iter().map(|r| r.end_s).fold(1e-3, f64::max) * 1.02;
    let y1 = ok.iter().filter_map(|r| r.e2el_ms).fold(1e-3, f64::max) / 1e3 * 1.1;
    let root = SVGBackend::with_string(out, (1000, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x1, 0.0..y1)?;
    chart
        .configure_mesh()
        .x_desc("request start (s from the start of the run)")
        .y_desc("latency (s)")
        .draw()?;
    let e2el: Vec<(f64, f64)> = ok.iter().filter_map(|r| Some((r.start_s, r.e2el_ms? / 1e3))).collect();
    let ttft: Vec<(f64, f64)> = ok.iter().filter_map(|r| Some((r.start_s, r.ttft_ms? / 1e3))).collect();
    chart
        .draw_series(e2el.iter().map(|&p| Circle::new(p, 2, RED.mix(0.35).filled())))?
        .label("E2EL of a request")
        .legend(|(x, y)| Circle::new((x + 8, y), 3, RED.mix(0.6).filled()));
    chart
        .draw_series(ttft.iter().map(|&p| Circle::new(p, 2, BLUE.mix(0.35).filled())))?
        .label("TTFT of a request")
        .legend(|(x, y)| Circle::new((x + 8, y), 3, BLUE.mix(0.6).filled()));
    let mid = |w: &crate::loadgen::report::DriftWindow| (w.start_s + w.end_s) / 2.0;
    if !drift.windows.is_empty() {
        let line = |get: fn(&crate::loadgen::report::DriftWindow) -> f64| -> Vec<(f64, f64)> {
            drift.windows.iter().filter(|w| get(w).is_finite()).map(|w| (mid(w), get(w) / 1e3)).collect()
        };
        chart
            .draw_series(LineSeries::new(line(|w| w.p99_e2el_ms), RED.stroke_width(2)))?
            .label(format!("P99 E2EL per window ({})", drift.verdict))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(line(|w| w.p99_ttft_ms), BLUE.stroke_width(2)))?
            .label("P99 TTFT per window")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    }
    let failed: Vec<f64> = records.iter().filter(|r| !r.success).map(|r| r.start_s).collect();
    if !failed.is_empty() {
        chart
            .draw_series(failed.iter().map(|&x| Cross::new((x, 0.0), 5, BLACK.stroke_width(2))))?
            .label(format!("failed request ({})", failed.len()))
            .legend(|(x, y)| Cross::new((x + 8, y), 4, BLACK.stroke_width(2)));
    }
    Ok(finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::report::p99_drift;

    #[test]
    fn the_picture_shows_requests_windows_and_failures() {
        let records: Vec<RequestRecord> = (0..60)
            .map(|i| {
                let r = RequestRecord::for_test(i as f64, 100.0, 500.0 + i as f64);
                if i % 20 == 7 {
                    r.failed()
                } else {
                    r
                }
            })
            .collect();
        let drift = p99_drift(&records, 60.0);
        let svg = bench_svg("run", &records, &drift).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in ["P99 E2EL per window", "TTFT of a request", "failed request (3)"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
