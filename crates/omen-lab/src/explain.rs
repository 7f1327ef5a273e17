//! `omen explain`: the coupled degradation model (L = c + α/T + βF + γ(1−Q)) on a store's
//! history, as a table, JSON and a bar chart of what moved the latency between the two
//! halves of the window. The computation is the agent's own (omen_agent::engine::explain),
//! the same one /scores/latest shows.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use omen_agent::engine::{explain, LatencyExplanation};
use omen_store::Store;
use plotters::prelude::*;

use crate::replay::fmt_ts;

/// What to explain.
#[derive(Debug, Clone)]
pub struct ExplainOptions {
    /// The agent's store (SQLite).
    pub store: PathBuf,
    /// Window start: RFC 3339, Unix seconds, `now` or `now-6h` (now = the store's newest sample).
    pub since: String,
    /// Window end, same forms.
    pub until: String,
    /// Where "before" ends and "after" begins (default: the middle of the window).
    pub split: Option<String>,
    /// Confidence level of the intervals.
    pub confidence: f64,
    /// Least R² for an attribution.
    pub min_r_squared: f64,
}

/// Runs the model on the store's window.
pub fn run(o: &ExplainOptions) -> Result<LatencyExplanation> {
    if !o.store.exists() {
        bail!("the store {} does not exist; give the agent's store.path", o.store.display());
    }
    let store = Store::open(&o.store)?;
    let Some(latest) = store.latest_ts()? else {
        bail!("the store {} holds no samples; run the agent first", o.store.display());
    };
    let now = latest + 1;
    let time = |flag: &str, text: &str| {
        omen_sources::clock::parse_time(text, now).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
    };
    let since = time("since", &o.since)?;
    let until = time("until", &o.until)?;
    if since >= until {
        bail!("--since ({}) must be before --until ({})", o.since, o.until);
    }
    let split = match &o.split {
        Some(s) => time("split", s)?,
        None => since + (until - since) / 2,
    };
    if !(since < split && split < until) {
        bail!("--split must lie inside the window");
    }
    explain(&store, since, until, split, 60_000, o.confidence, o.min_r_squared)
        .with_context(|| format!("cannot read {}", o.store.display()))
}

/// The explanation as a text table.
pub fn table(e: &LatencyExplanation) -> String {
    let mut out =
        format!("window {} .. {} (split {})\n", fmt_ts(e.since_ms), fmt_ts(e.until_ms), fmt_ts(e.split_ms));
    if let Some(m) = &e.model {
        let pct = (m.confidence * 100.0).round();
        out += &format!(
            "model L = c + a/T + b*F + g*(1-Q): {} minutes, R2 {:.3}\n",
            m.observations, m.r_squared
        );
        out += &format!("  {:<28} {:>12} {:>26}\n", "term", "estimate", format!("{pct}% interval"));
        for (name, c) in [
            ("c (baseline latency, s)", Some(m.intercept_s)),
            ("a (throughput, s*tok/s)", m.alpha),
            ("b (TTFT, s/s)", m.beta),
            ("g (quality loss, s)", m.gamma),
        ] {
            out += &match c {
                Some(c) => {
                    format!("  {name:<28} {:>12.4} [{:>11.4}, {:>11.4}]\n", c.estimate, c.lower, c.upper)
                }
                None => format!("  {name:<28} {:>12} (did not vary in the window: left out)\n", "-"),
            };
        }
    }
    if let Some(a) = &e.attribution {
        out += &format!(
            "latency {:.3} s -> {:.3} s ({:+.3} s):\n  throughput {:+.3} s, TTFT {:+.3} s, quality {:+.3} s, unexplained {:+.3} s\n",
            a.before_s,
            a.after_s,
            a.after_s - a.before_s,
            a.throughput_s,
            a.ttft_s,
            a.quality_s,
            a.unexplained_s
        );
    }
    if let Some(r) = &e.reason {
        out += &format!("no attribution: {r}\n");
    }
    out
}

/// The attribution as a bar chart (SVG); an error when there is none.
pub fn plot(e: &LatencyExplanation, path: &Path) -> Result<()> {
    let Some(a) = &e.attribution else {
        bail!("no attribution to draw: {}", e.reason.as_deref().unwrap_or("no fit"));
    };
    let bars = [
        ("throughput (a/T)", a.throughput_s),
        ("TTFT (b*F)", a.ttft_s),
        ("quality (g*(1-Q))", a.quality_s),
        ("unexplained", a.unexplained_s),
        ("total change", a.after_s - a.before_s),
    ];
    let (lo, hi) = bars.iter().fold((0.0f64, 0.0f64), |(lo, hi), (_, v)| (lo.min(*v), hi.max(*v)));
    let pad = ((hi - lo) * 0.15).max(1e-3);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("What moved the latency: {:.3} s -> {:.3} s", a.before_s, a.after_s),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(bars.len() as f64 - 0.5), (lo - pad)..(hi + pad))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                bars.get(i as usize).map_or_else(String::new, |b| b.0.to_owned())
            } else {
                String::new()
            }
        })
        .y_desc("seconds of end-to-end latency")
        .draw()?;
    for (i, (name, v)) in bars.iter().enumerate() {
        let color = match *name {
            "total change" => RGBColor(60, 60, 60),
            "unexplained" => RGBColor(170, 170, 170),
            _ if *v >= 0.0 => RGBColor(200, 70, 50),
            _ => RGBColor(60, 140, 80),
        };
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x - 0.32, 0.0), (x + 0.32, *v)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{v:+.3} s"),
            (x - 0.18, if *v >= 0.0 { *v + pad * 0.3 } else { *v - pad * 0.15 }),
            ("sans-serif", 15),
        )))?;
    }
    chart
        .draw_series(LineSeries::new([(-0.5, 0.0), (bars.len() as f64 - 0.5, 0.0)], BLACK.stroke_width(1)))?;
    root.present()?;
    Ok(())
}
