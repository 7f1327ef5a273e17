//! `omen pareto`: sweep workflow knobs and report the settings that no other setting beats
//! on both cost (or latency) and answer quality.
//!
//! Each knob is `name=v1,v2,...`; the grid of every combination is run, each point as one
//! `omen bench` of the workflow with those settings. A knob is a workflow field
//! (`concurrency`, `max_tokens`, `temperature`, `ignore_eos`) or any request field as
//! `extra_body.NAME` (e.g. `extra_body.top_p`). Quality is the mean sentence BLEU of the
//! answers against the workflow's references; the other axis is the mean cost per request
//! (with a price table) or the P95 end-to-end latency. A point is on the front when no
//! other point is at least as good on both axes and better on one.

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

use crate::cost::PriceTable;
use crate::loadgen::{workflow::Workflow, BenchOptions};
use crate::suite::{self, SuiteError, SuiteOptions};

/// Most grid points a sweep may have.
pub const MAX_POINTS: usize = 64;

/// One swept knob and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Knob {
    /// `concurrency`, `max_tokens`, `temperature`, `ignore_eos` or `extra_body.NAME`.
    pub name: String,
    /// The values, as written.
    pub values: Vec<String>,
}

/// A sweep could not be set up; names the option and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ParetoError {
    /// A `--sweep` is malformed or names an unknown knob.
    #[error("--sweep {given:?}: {reason}")]
    Knob {
        /// The option value.
        given: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The sweep cannot measure what the front needs.
    #[error("{0}")]
    Setup(String),
    /// A point could not run.
    #[error(transparent)]
    Suite(#[from] SuiteError),
    /// The picture could not be drawn.
    #[error("cannot draw the Pareto plot: {0}")]
    Plot(String),
    /// An option is out of range.
    #[error(transparent)]
    Option(#[from] crate::BadOption),
}

impl std::str::FromStr for Knob {
    type Err = ParetoError;

    fn from_str(s: &str) -> Result<Self, ParetoError> {
        let bad = |reason: &str| ParetoError::Knob { given: s.to_owned(), reason: reason.to_owned() };
        let (name, values) =
            s.split_once('=').ok_or_else(|| bad("write NAME=V1,V2,..., e.g. max_tokens=8,16,32"))?;
        let name = name.trim();
        let known = ["concurrency", "max_tokens", "temperature", "ignore_eos"];
        if !known.contains(&name) && name.strip_prefix("extra_body.").is_none_or(str::is_empty) {
            return Err(bad("knobs are concurrency, max_tokens, temperature, ignore_eos or extra_body.FIELD (any request field)"));
        }
        let values: Vec<String> =
            values.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect();
        if values.is_empty() {
            return Err(bad("give at least one value after ="));
        }
        Ok(Knob { name: name.to_owned(), values })
    }
}

/// Sets `knob` to `value` in `wf`, then checks the workflow again.
pub fn apply(wf: &mut Workflow, knob: &str, value: &str) -> Result<(), ParetoError> {
    let bad = |reason: String| ParetoError::Knob { given: format!("{knob}={value}"), reason };
    let number = || value.parse::<f64>().map_err(|_| bad(format!("{value:?} is not a number")));
    match knob {
        "concurrency" => wf.concurrency = value.parse().map_err(|_| bad("a whole number >= 1".into()))?,
        "max_tokens" => wf.max_tokens = value.parse().map_err(|_| bad("a whole number >= 1".into()))?,
        "temperature" => wf.temperature = number()?,
        "ignore_eos" => wf.ignore_eos = value.parse().map_err(|_| bad("true or false".into()))?,
        _ => {
            let field = knob.trim_start_matches("extra_body.");
            // Numbers and booleans as JSON, anything else as a string.
            let v: Value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
            wf.extra_body.insert(field.to_owned(), v);
        }
    }
    wf.validate(&format!("{} with {knob}={value}", wf.name)).map_err(|e| bad(e.to_string()))
}

/// Every combination of the knobs' values, as (knob, value) lists.
pub fn grid(knobs: &[Knob]) -> Vec<Vec<(String, String)>> {
    let mut points: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for k in knobs {
        points = points
            .into_iter()
            .flat_map(|p| {
                k.values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push((k.name.clone(), v.clone()));
                    q
                })
            })
            .collect();
    }
    points
}

/// What the non-quality axis measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Mean cost per request (needs a price table).
    Cost,
    /// P95 end-to-end latency, ms.
    Latency,
}

/// One measured grid point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParetoPoint {
    /// The knob settings.
    pub settings: Vec<(String, String)>,
    /// Cost per request or P95 E2EL (lower is better).
    pub objective: f64,
    /// Mean BLEU (higher is better).
    pub quality: f64,
    /// Successful requests.
    pub completed: u64,
    /// Failed requests.
    pub failed: u64,
    /// Why the point cannot be on the front (too many failures: its cost and quality are
    /// of the few requests that succeeded), if it cannot.
    pub excluded: Option<String>,
    /// On the front.
    pub on_front: bool,
}

/// Marks the points no other point dominates (lower objective, higher quality); excluded
/// and unmeasured points take no part.
pub fn mark_front(points: &mut [ParetoPoint]) {
    let eligible = |p: &ParetoPoint| p.excluded.is_none() && p.objective.is_finite() && p.quality.is_finite();
    let snapshot: Vec<Option<(f64, f64)>> =
        points.iter().map(|p| eligible(p).then_some((p.objective, p.quality))).collect();
    for (i, p) in points.iter_mut().enumerate() {
        p.on_front = snapshot[i].is_some_and(|(o, q)| {
            !snapshot.iter().enumerate().any(|(j, other)| {
                j != i && other.is_some_and(|(oj, qj)| oj <= o && qj >= q && (oj < o || qj > q))
            })
        });
    }
}

/// The sweep's result.
#[derive(Debug, Clone, Serialize)]
pub struct ParetoReport {
    /// Workflow name.
    pub workflow: String,
    /// What the objective axis is.
    pub objective: Objective,
    /// Every point, in run order.
    pub points: Vec<ParetoPoint>,
}

fn label(settings: &[(String, String)]) -> String {
    settings
        .iter()
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches("extra_body.")))
        .collect::<Vec<_>>()
        .join(" ")
}

impl ParetoReport {
    /// The points as a fixed-width table, the front first.
    pub fn table(&self) -> String {
        let axis = match self.objective {
            Objective::Cost => "cost/request",
            Objective::Latency => "p95 e2el ms",
        };
        let mut out =
            format!("{:<40} {:>14} {:>10} {:>9}  {}\n", "settings", axis, "mean BLEU", "ok/fail", "front");
        let mut order: Vec<&ParetoPoint> = self.points.iter().collect();
        order.sort_by(|a, b| b.on_front.cmp(&a.on_front).then(a.objective.total_cmp(&b.objective)));
        for p in order {
            out.push_str(&format!(
                "{:<40} {:>14.6e} {:>10.2} {:>4}/{:<4}  {}\n",
                label(&p.settings),
                p.objective,
                p.quality,
                p.completed,
                p.failed,
                if p.on_front {
                    "*"
                } else if p.excluded.is_some() {
                    "excluded"
                } else {
                    ""
                }
            ));
        }
        out
    }

    /// The points as SVG, the front joined by a line.
    pub fn svg(&self) -> Result<String, ParetoError> {
        let mut out = String::new();
        self.draw(&mut out).map_err(|e| ParetoError::Plot(e.to_string()))?;
        Ok(out)
    }

    fn draw<'a>(&self, out: &'a mut String) -> Result<(), Box<dyn std::error::Error + 'a>> {
        let finite: Vec<&ParetoPoint> =
            self.points.iter().filter(|p| p.objective.is_finite() && p.quality.is_finite()).collect();
        let (mut x0, mut x1) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.objective), b.max(p.objective)));
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        let pad = ((x1 - x0) * 0.1).max(x1.abs() * 0.05).max(1e-12);
        let y1 = finite.iter().map(|p| p.quality).fold(1.0, f64::max) * 1.1;
        let root = SVGBackend::with_string(out, (900, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let x_desc = match self.objective {
            Objective::Cost => "mean cost per request",
            Objective::Latency => "P95 end-to-end latency (ms)",
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: quality against {}", self.workflow, x_desc), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(x0 - pad..x1 + pad, 0.0..y1)?;
        chart.configure_mesh().x_desc(x_desc).y_desc("mean BLEU against the references").draw()?;
        let mut front: Vec<(f64, f64)> =
            finite.iter().filter(|p| p.on_front).map(|p| (p.objective, p.quality)).collect();
        front.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(front.clone(), RED.stroke_width(2)))?
            .label("Pareto front")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.stroke_width(2)));
        chart.draw_series(finite.iter().map(|p| {
            let style = if p.on_front { RED.filled() } else { BLACK.mix(0.5).filled() };
            EmptyElement::at((p.objective, p.quality))
                + Circle::new((0, 0), 5, style)
                + Text::new(label(&p.settings), (8, -6), ("sans-serif", 11))
        }))?;
        Ok(crate::picture::finish(&mut chart, &root, SeriesLabelPosition::LowerRight)?)
    }
}

/// Runs every grid point against `opts.endpoint`; `say` gets a line per finished point.
pub async fn sweep(
    wf: &Workflow,
    opts: &BenchOptions,
    knobs: &[Knob],
    prices: Option<(String, PriceTable)>,
    max_error_rate: f64,
    mut say: impl FnMut(&str),
) -> Result<ParetoReport, ParetoError> {
    if !(0.0..1.0).contains(&max_error_rate) {
        return Err(crate::BadOption {
            option: "--max-error-rate",
            value: max_error_rate.to_string(),
            reason: "must be in [0, 1), e.g. 0.05",
        }
        .into());
    }
    if !wf.states.values().any(|s| !s.references.is_empty()) {
        return Err(ParetoError::Setup(format!(
            "workflow {:?} gives no `references`, so answers cannot be scored; add one reference answer per prompt to its states",
            wf.name
        )));
    }
    for (i, k) in knobs.iter().enumerate() {
        if knobs[..i].iter().any(|o| o.name == k.name) {
            return Err(ParetoError::Knob {
                given: format!("{}=...", k.name),
                reason: "is given twice; give all its values in one --sweep, e.g. max_tokens=8,16".into(),
            });
        }
    }
    let points = grid(knobs);
    if points.len() > MAX_POINTS {
        return Err(ParetoError::Setup(format!(
            "--sweep: the grid has {} points, more than {MAX_POINTS}; give fewer knobs or values",
            points.len()
        )));
    }
    // Every point's workflow is checked before any load is sent.
    let mut workflows = Vec::with_capacity(points.len());
    for settings in &points {
        let mut w = wf.clone();
        for (k, v) in settings {
            apply(&mut w, k, v)?;
        }
        workflows.push(w);
    }
    let objective = if prices.is_some() { Objective::Cost } else { Objective::Latency };
    let options = SuiteOptions {
        repeat: 1,
        stable_spread: 1.0,
        require_stable: false,
        prices,
        omen: None,
        server_metrics: None,
    };
    let total = points.len();
    let mut measured = Vec::with_capacity(total);
    for (i, (settings, w)) in points.into_iter().zip(workflows).enumerate() {
        let result = suite::run(&w, opts, &options, |_| {}).await?;
        let r = &result.report;
        let objective_value = match objective {
            Objective::Cost => r["omen"]["cost"]["mean_cost_per_request"].as_f64(),
            Objective::Latency => r["p95_e2el_ms"].as_f64(),
        }
        .unwrap_or(f64::NAN);
        let (completed, failed) = (r["completed"].as_u64().unwrap_or(0), r["failed"].as_u64().unwrap_or(0));
        let error_rate = failed as f64 / (completed + failed).max(1) as f64;
        let point = ParetoPoint {
            objective: objective_value,
            quality: r["mean_bleu"].as_f64().unwrap_or(f64::NAN),
            completed,
            failed,
            excluded: (error_rate > max_error_rate).then(|| {
                format!(
                    "{failed} of {} requests failed (more than --max-error-rate {max_error_rate})",
                    completed + failed
                )
            }),
            settings,
            on_front: false,
        };
        say(&format!(
            "point {}/{total}: {} -> {:.6e}, BLEU {:.2} ({} ok, {} failed){}",
            i + 1,
            label(&point.settings),
            point.objective,
            point.quality,
            point.completed,
            point.failed,
            point.excluded.as_ref().map_or(String::new(), |e| format!("; not on the front: {e}"))
        ));
        measured.push(point);
    }
    mark_front(&mut measured);
    Ok(ParetoReport { workflow: wf.name.clone(), objective, points: measured })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WF: &str =
        "name: t\nmax_requests: 2\narrival: { rate: 1.0 }\nstart: a\nstates:\n  a:\n    prompts: [\"hi\"]\n";

    fn point(objective: f64, quality: f64) -> ParetoPoint {
        ParetoPoint {
            settings: vec![],
            objective,
            quality,
            completed: 1,
            failed: 0,
            excluded: None,
            on_front: false,
        }
    }

    #[test]
    fn the_front_keeps_only_undominated_points() {
        let mut pts = vec![
            point(1.0, 10.0),
            point(2.0, 20.0),
            point(2.5, 15.0),
            point(3.0, 30.0),
            point(1.0, 5.0),
            point(f64::NAN, 50.0),
        ];
        mark_front(&mut pts);
        let front: Vec<bool> = pts.iter().map(|p| p.on_front).collect();
        // (2.5, 15) is beaten by (2, 20); (1, 5) by (1, 10); a point without a measurement is never on it.
        assert_eq!(front, [true, true, false, true, false, false]);
        // Ties: two identical points both stay.
        let mut tie = vec![point(1.0, 1.0), point(1.0, 1.0)];
        mark_front(&mut tie);
        assert!(tie.iter().all(|p| p.on_front));
        // A point whose requests mostly failed neither joins the front nor pushes others off it.
        let mut failing = vec![point(0.5, 50.0), point(1.0, 10.0)];
        failing[0].excluded = Some("9 of 10 requests failed".into());
        mark_front(&mut failing);
        assert_eq!(failing.iter().map(|p| p.on_front).collect::<Vec<_>>(), [false, true]);
    }

    #[test]
    fn knobs_parse_apply_and_make_a_grid() {
        let a: Knob = "max_tokens=8,16".parse().unwrap();
        let b: Knob = "extra_body.top_p = 0.5, 0.9".parse().unwrap();
        assert_eq!(b.name, "extra_body.top_p");
        let g = grid(&[a, b]);
        assert_eq!(g.len(), 4);
        assert_eq!(
            g[3],
            [("max_tokens".to_owned(), "16".to_owned()), ("extra_body.top_p".to_owned(), "0.9".to_owned())]
        );
        let mut wf = Workflow::from_yaml(WF, "t.yaml").unwrap();
        apply(&mut wf, "max_tokens", "16").unwrap();
        apply(&mut wf, "extra_body.top_p", "0.9").unwrap();
        apply(&mut wf, "extra_body.stop", "END").unwrap();
        assert_eq!(wf.max_tokens, 16);
        assert_eq!(wf.extra_body["top_p"], 0.9);
        assert_eq!(wf.extra_body["stop"], "END");
        for (bad, why) in
            [("max_tokens", "NAME=V1,V2"), ("colour=red", "knobs are"), ("max_tokens=", "at least one value")]
        {
            let e = bad.parse::<Knob>().unwrap_err().to_string();
            assert!(e.contains("--sweep") && e.contains(why), "{bad}: {e}");
        }
        let e = apply(&mut wf, "max_tokens", "0").unwrap_err().to_string();
        assert!(e.contains("max_tokens=0") && e.contains("at least 1"), "{e}");
        let e = apply(&mut wf, "temperature", "hot").unwrap_err().to_string();
        assert!(e.contains("not a number"), "{e}");
    }

    #[test]
    fn the_report_draws_and_tabulates_the_front() {
        let mut pts = vec![point(1.0, 10.0), point(2.0, 20.0), point(2.5, 15.0)];
        pts[0].settings = vec![("max_tokens".into(), "8".into())];
        mark_front(&mut pts);
        let r = ParetoReport { workflow: "w".into(), objective: Objective::Latency, points: pts };
        let t = r.table();
        assert!(
            t.lines().nth(1).unwrap().starts_with("max_tokens=8") && t.lines().nth(1).unwrap().ends_with('*'),
            "{t}"
        );
        let svg = r.svg().unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("Pareto front") && svg.contains("max_tokens=8"));
    }
}
