//! `omen capacity`: the highest session arrival rate a server sustains while its P99 TTFT
//! and P99 end-to-end latency stay under given bounds (and errors under a share).
//!
//! Each step runs the workflow at one constant Poisson rate for a warm-up window (its
//! requests are not judged) and a steady window (they are). The rate doubles from
//! `start_rate` until a step fails or `max_rate` is reached, then the gap between the last
//! passing and the first failing rate is bisected geometrically until it is narrower than
//! `resolution`. The client never limits the load: the workflow's QPS caps and round-trip
//! back-off are off and up to `concurrency` requests are in flight, so waiting shows up in
//! the server's TTFT rather than in the client's queue. The report holds the rate-vs-P99
//! curve, the highest passing rate with the concurrency it meant, and the saturation knee
//! of the curve; the picture is an SVG beside it.

use std::time::Duration;

use plotters::prelude::*;
use serde::Serialize;

use crate::loadgen::{self, workflow::Workflow, BenchError, BenchOptions, RequestRecord};

/// Settings of a capacity search (also `omen capacity`'s options).
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityOptions {
    /// P99 time-to-first-token bound, e.g. 2s.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub p99_ttft: Duration,
    /// P99 end-to-end latency bound, e.g. 10s.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub p99_e2el: Duration,
    /// Largest share of failed requests a passing rate may have.
    #[arg(long, default_value_t = 0.01)]
    pub max_error_rate: f64,
    /// First rate tried, sessions/s; it doubles until a bound breaks.
    #[arg(long, default_value_t = 0.5)]
    pub start_rate: f64,
    /// Highest rate tried, sessions/s.
    #[arg(long, default_value_t = 64.0)]
    pub max_rate: f64,
    /// Bisect until first-failing / last-passing <= 1 + this.
    #[arg(long, default_value_t = 0.25)]
    pub resolution: f64,
    /// Per step: requests started in this first window are not judged.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Per step: requests started in this window after the warm-up are judged.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub steady: Duration,
    /// Most requests in flight (high, so the server rather than the client queues).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
}

/// A setting is out of range; names the option and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// An option is out of range.
    #[error(transparent)]
    Option(#[from] crate::BadOption),
    /// A step could not run.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// The picture could not be drawn.
    #[error("cannot draw the capacity plot: {0}")]
    Plot(String),
}

impl CapacityOptions {
    /// Checks the ranges; every error names the option.
    pub fn validate(&self) -> Result<(), CapacityError> {
        let bad = |option, value: String, reason| Err(crate::BadOption { option, value, reason }.into());
        if self.p99_ttft.is_zero() {
            return bad("--p99-ttft", format!("{:?}", self.p99_ttft), "must be positive, e.g. 2s");
        }
        if self.p99_e2el.is_zero() {
            return bad("--p99-e2el", format!("{:?}", self.p99_e2el), "must be positive, e.g. 10s");
        }
        if !(self.start_rate.is_finite() && self.start_rate > 0.0) {
            return bad(
                "--start-rate",
                self.start_rate.to_string(),
                "must be a positive sessions/s, e.g. 0.5",
            );
        }
        if !(self.max_rate.is_finite() && self.max_rate >= self.start_rate) {
            return bad("--max-rate", self.max_rate.to_string(), "must be at least --start-rate");
        }
        if !(self.resolution.is_finite() && self.resolution > 0.0) {
            return bad("--resolution", self.resolution.to_string(), "must be > 0, e.g. 0.25 for 25%");
        }
        if !(0.0..1.0).contains(&self.max_error_rate) {
            return bad("--max-error-rate", self.max_error_rate.to_string(), "must be in [0, 1), e.g. 0.01");
        }
        if self.steady.is_zero() {
            return bad("--steady", format!("{:?}", self.steady), "must be positive, e.g. 30s");
        }
        if self.concurrency == 0 {
            return bad("--concurrency", "0".into(), "must be at least 1");
        }
        Ok(())
    }
}

/// What one rate step measured in its steady window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityPoint {
    /// Offered session arrival rate, sessions per second.
    pub rate: f64,
    /// Requests started in the steady window.
    pub requests: usize,
    /// Of them, completed.
    pub completed: usize,
    /// Failed share.
    pub error_rate: f64,
    /// Completed requests per steady second.
    pub request_throughput: f64,
    /// Output tokens per steady second.
    pub output_throughput: f64,
    /// Median TTFT, ms.
    pub median_ttft_ms: f64,
    /// P99 TTFT, ms.
    pub p99_ttft_ms: f64,
    /// Median end-to-end latency, ms.
    pub median_e2el_ms: f64,
    /// P99 end-to-end latency, ms.
    pub p99_e2el_ms: f64,
    /// Mean requests in flight (Little's law: throughput x mean latency).
    pub mean_concurrency: f64,
    /// Most requests in flight at once.
    pub max_concurrency: usize,
    /// Within every bound.
    pub pass: bool,
    /// Which bounds were broken.
    pub broken: Vec<String>,
    /// Failed requests by error class (`timeout`, `http_503`, ...), with one message each.
    pub errors: std::collections::BTreeMap<String, ErrorClass>,
}

/// The failures of one class in a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorClass {
    /// How many.
    pub count: usize,
    /// The first one's message.
    pub example: String,
}

fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    omen_signals::quantile_linear(xs, q)
}

/// Judges one step from its records: those started at or after `warmup_s` and within `steady_s` of it.
pub fn judge(
    rate: f64,
    records: &[RequestRecord],
    warmup_s: f64,
    steady_s: f64,
    opts: &CapacityOptions,
) -> CapacityPoint {
    let window: Vec<&RequestRecord> =
        records.iter().filter(|r| r.start_s >= warmup_s && r.start_s < warmup_s + steady_s).collect();
    let ok: Vec<&&RequestRecord> = window.iter().filter(|r| r.success).collect();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
    let mut e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2el_ms).collect();
    let error_rate = if window.is_empty() { 0.0 } else { 1.0 - ok.len() as f64 / window.len() as f64 };
    let request_throughput = ok.len() as f64 / steady_s;
    let mean_e2el_s = if e2el.is_empty() { 0.0 } else { e2el.iter().sum::<f64>() / e2el.len() as f64 / 1e3 };
    // Requests in flight: +1 at each start, -1 at each end, in time order (ends first on ties).
    let mut events: Vec<(f64, i32)> = window.iter().flat_map(|r| [(r.start_s, 1), (r.end_s, -1)]).collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    let (p99_ttft_ms, p99_e2el_ms) = (quantile(&mut ttft, 0.99), quantile(&mut e2el, 0.99));
    let mut broken = Vec::new();
    if ok.is_empty() {
        broken.push("no request completed in the steady window".to_owned());
    } else {
        let ttft_bound = opts.p99_ttft.as_secs_f64() * 1e3;
        if p99_ttft_ms > ttft_bound {
            broken.push(format!("P99 TTFT {p99_ttft_ms:.0} ms > {ttft_bound:.0} ms"));
        }
        let e2el_bound = opts.p99_e2el.as_secs_f64() * 1e3;
        if p99_e2el_ms > e2el_bound {
            broken.push(format!("P99 E2EL {p99_e2el_ms:.0} ms > {e2el_bound:.0} ms"));
        }
    }
    if most.max(0) as usize >= opts.concurrency {
        // Requests then waited for a slot in omen, where no latency counts.
        broken.push(format!(
            "{most} requests in flight reached --concurrency {}: the client queued; raise --concurrency",
            opts.concurrency
        ));
    }
    if error_rate > opts.max_error_rate {
        broken.push(format!("error rate {:.1}% > {:.1}%", error_rate * 100.0, opts.max_error_rate * 100.0));
    }
    let mut errors = std::collections::BTreeMap::<String, ErrorClass>::new();
    for r in window.iter().filter(|r| !r.success) {
        let kind = r.error_kind.clone().unwrap_or_else(|| "unknown".into());
        errors
            .entry(kind)
            .or_insert_with(|| ErrorClass { count: 0, example: r.error.clone().unwrap_or_default() })
            .count += 1;
    }
    CapacityPoint {
        errors,
        rate,
        requests: window.len(),
        completed: ok.len(),
        error_rate,
        request_throughput,
        output_throughput: ok.iter().map(|r| r.output_tokens as f64).sum::<f64>() / steady_s,
        median_ttft_ms: quantile(&mut ttft, 0.5),
        p99_ttft_ms,
        median_e2el_ms: quantile(&mut e2el, 0.5),
        p99_e2el_ms,
        mean_concurrency: request_throughput * mean_e2el_s,
        max_concurrency: most.max(0) as usize,
        pass: broken.is_empty(),
        broken,
    }
}

/// The next rate to try after `points`, or None when the search is done.
pub fn next_rate(points: &[CapacityPoint], opts: &CapacityOptions) -> Option<f64> {
    if points.is_empty() {
        return Some(opts.start_rate);
    }
    let lo = points.iter().filter(|p| p.pass).map(|p| p.rate).reduce(f64::max)?;
    match points.iter().filter(|p| !p.pass && p.rate > lo).map(|p| p.rate).reduce(f64::min) {
        // Still climbing: double, ending exactly at max_rate.
        None if lo < opts.max_rate => Some((lo * 2.0).min(opts.max_rate)),
        None => None,
        Some(hi) if hi / lo > 1.0 + opts.resolution => Some((lo * hi).sqrt()),
        Some(_) => None,
    }
}

/// The saturation knee of the rate-vs-P99-E2EL curve (Kneedle: the point farthest below the
/// chord of the normalised curve), when there are 3+ points and the curve bends upwards.
pub fn knee(points: &[CapacityPoint]) -> Option<f64> {
    let pts: Vec<(f64, f64)> =
        points.iter().filter(|p| p.p99_e2el_ms.is_finite()).map(|p| (p.rate, p.p99_e2el_ms)).collect();
    if pts.len() < 3 {
        return None;
    }
    let (x0, y0) = pts[0];
    let (x1, y1) = pts[pts.len() - 1];
    if x1 <= x0 || y1 <= y0 {
        return None;
    }
    let (best, gap) = pts
        .iter()
        .map(|&(x, y)| (x, (x - x0) / (x1 - x0) - (y - y0) / (y1 - y0)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    // A nearly straight curve has no knee worth naming.
    (gap > 0.1).then_some(best)
}

/// The result of a capacity search.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityReport {
    /// Model used.
    pub model: String,
    /// Endpoint used.
    pub endpoint: String,
    /// Workflow name.
    pub workflow: String,
    /// P99 TTFT bound, ms.
    pub p99_ttft_bound_ms: f64,
    /// P99 E2EL bound, ms.
    pub p99_e2el_bound_ms: f64,
    /// Largest allowed error share.
    pub max_error_rate: f64,
    /// Warm-up window per step, seconds.
    pub warmup_s: f64,
    /// Steady window per step, seconds.
    pub steady_s: f64,
    /// Every step, by rate.
    pub points: Vec<CapacityPoint>,
    /// The highest passing step.
    pub max_sustained: Option<CapacityPoint>,
    /// The lowest failing step above it.
    pub first_failing: Option<CapacityPoint>,
    /// Whether the search stopped at `max_rate` with every step passing.
    pub capped_at_max_rate: bool,
    /// The rate at the knee of the P99 E2EL curve.
    pub knee_rate: Option<f64>,
    /// One line for a person.
    pub verdict: String,
}

impl CapacityReport {
    fn new(run: &StepContext, mut points: Vec<CapacityPoint>, opts: &CapacityOptions) -> Self {
        points.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let max_sustained =
            points.iter().filter(|p| p.pass).max_by(|a, b| a.rate.total_cmp(&b.rate)).cloned();
        let first_failing = points
            .iter()
            .filter(|p| !p.pass && max_sustained.as_ref().is_none_or(|m| p.rate > m.rate))
            .min_by(|a, b| a.rate.total_cmp(&b.rate))
            .cloned();
        let capped = first_failing.is_none() && max_sustained.is_some();
        let verdict = match (&max_sustained, &first_failing) {
            (None, Some(f)) => format!(
                "no rate passed: already at {} sessions/s {}; lower --start-rate or loosen the bounds",
                f.rate,
                f.broken.join(", ")
            ),
            (Some(m), Some(f)) => format!(
                "sustains {:.3} sessions/s ({:.2} requests/s, {:.1} in flight on average) within the bounds; at {:.3} sessions/s {}",
                m.rate,
                m.request_throughput,
                m.mean_concurrency,
                f.rate,
                f.broken.join(", ")
            ),
            (Some(m), None) => format!(
                "sustains at least {:.3} sessions/s ({:.2} requests/s), the --max-rate; raise it to find the limit",
                m.rate, m.request_throughput
            ),
            (None, None) => "no step ran".to_owned(),
        };
        CapacityReport {
            model: run.model.clone(),
            endpoint: run.endpoint.clone(),
            workflow: run.workflow.clone(),
            p99_ttft_bound_ms: opts.p99_ttft.as_secs_f64() * 1e3,
            p99_e2el_bound_ms: opts.p99_e2el.as_secs_f64() * 1e3,
            max_error_rate: opts.max_error_rate,
            warmup_s: opts.warmup.as_secs_f64(),
            steady_s: opts.steady.as_secs_f64(),
            knee_rate: knee(&points),
            points,
            max_sustained,
            first_failing,
            capped_at_max_rate: capped,
            verdict,
        }
    }

    /// The rate-vs-P99 curve with the bounds, the highest passing rate and the knee, as SVG.
    pub fn svg(&self) -> Result<String, CapacityError> {
        let mut out = String::new();
        self.draw(&mut out).map_err(|e| CapacityError::Plot(e.to_string()))?;
        Ok(out)
    }

    fn draw(&self, out: &mut String) -> Result<(), Box<dyn std::error::Error + '_>> {
        let finite = |v: f64| v.is_finite().then_some(v);
        let x1 = self.points.iter().map(|p| p.rate).fold(0.0, f64::max).max(1e-3) * 1.08;
        let y1 = self
            .points
            .iter()
            .flat_map(|p| [finite(p.p99_ttft_ms), finite(p.p99_e2el_ms)])
            .flatten()
            .chain([self.p99_ttft_bound_ms, self.p99_e2el_bound_ms])
            .fold(0.0, f64::max)
            * 1.1
            / 1e3;
        let root = SVGBackend::with_string(out, (900, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("capacity of {} ({}): {}", self.model, self.workflow, short(&self.verdict)),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..x1, 0.0..y1.max(1e-3))?;
        chart.configure_mesh().x_desc("offered sessions/s").y_desc("P99 latency (s)").draw()?;
        type Get = fn(&CapacityPoint) -> f64;
        let series: [(&str, Get, f64, RGBColor); 2] = [
            ("P99 TTFT", |p: &CapacityPoint| p.p99_ttft_ms, self.p99_ttft_bound_ms, BLUE),
            ("P99 E2EL", |p: &CapacityPoint| p.p99_e2el_ms, self.p99_e2el_bound_ms, RED),
        ];
        for (name, get, bound, colour) in series {
            let line: Vec<(f64, f64)> =
                self.points.iter().filter_map(|p| finite(get(p)).map(|v| (p.rate, v / 1e3))).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
            chart.draw_series(line.iter().map(|&(x, y)| Circle::new((x, y), 4, colour.filled())))?;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, bound / 1e3), (x1, bound / 1e3)],
                    6,
                    4,
                    colour.mix(0.6).into(),
                ))?
                .label(format!("{name} bound"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.mix(0.6)));
        }
        if let Some(m) = &self.max_sustained {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(m.rate, 0.0), (m.rate, y1)],
                    GREEN.stroke_width(2),
                )))?
                .label(format!("highest passing rate {:.3}", m.rate))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], GREEN.stroke_width(2)));
        }
        if let Some(k) = self.knee_rate {
            chart
                .draw_series(DashedLineSeries::new([(k, 0.0), (k, y1)], 4, 4, BLACK.mix(0.5).into()))?
                .label(format!("knee {k:.3}"))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
        }
        Ok(crate::picture::finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)?)
    }
}

fn short(s: &str) -> &str {
    s.split(';').next().unwrap_or(s).split(" within").next().unwrap_or(s)
}

/// Names of the run, for the report.
struct StepContext {
    model: String,
    endpoint: String,
    workflow: String,
}

/// The workflow as a capacity step runs it: one constant rate, one attempt per request,
/// the client out of the way.
pub fn step_workflow(wf: &Workflow, rate: f64, opts: &CapacityOptions) -> Workflow {
    let mut step = wf.clone();
    step.arrival.rate = rate;
    step.arrival.rate_shape = None;
    step.rtt_backoff = None;
    step.concurrency = opts.concurrency;
    step.max_requests = None;
    step.duration = Some(opts.warmup + opts.steady);
    for s in step.states.values_mut() {
        s.qps = None;
        // A retry would time only its own attempt: a request that timed out and then
        // succeeded would count as fast. Each request gets one attempt.
        s.retries = 0;
    }
    step
}

/// Runs the search against `bench.endpoint`, calling `progress` with each finished step.
pub async fn search(
    wf: &Workflow,
    bench: &BenchOptions,
    opts: &CapacityOptions,
    mut progress: impl FnMut(usize, &CapacityPoint),
) -> Result<CapacityReport, CapacityError> {
    opts.validate()?;
    let mut points: Vec<CapacityPoint> = Vec::new();
    let mut context = None;
    while let Some(rate) = next_rate(&points, opts) {
        let step = step_workflow(wf, rate, opts);
        let mut options = bench.clone();
        options.max_requests = None;
        options.duration = None;
        // Later steps reuse the model the first one found.
        if let Some(StepContext { model, .. }) = &context {
            options.model = Some(model.clone());
        }
        let run = loadgen::bench(step, &options).await?;
        let point = judge(rate, &run.records, opts.warmup.as_secs_f64(), opts.steady.as_secs_f64(), opts);
        progress(points.len() + 1, &point);
        points.push(point);
        context.get_or_insert(StepContext {
            model: run.model,
            endpoint: run.endpoint,
            workflow: wf.name.clone(),
        });
    }
    let context = context.unwrap_or(StepContext {
        model: String::new(),
        endpoint: bench.endpoint.clone(),
        workflow: wf.name.clone(),
    });
    Ok(CapacityReport::new(&context, points, opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CapacityOptions {
        CapacityOptions {
            p99_ttft: Duration::from_secs(1),
            p99_e2el: Duration::from_secs(2),
            max_error_rate: 0.05,
            start_rate: 0.5,
            max_rate: 16.0,
            resolution: 0.25,
            warmup: Duration::from_secs(5),
            steady: Duration::from_secs(10),
            concurrency: 64,
        }
    }

    fn point(rate: f64, pass: bool) -> CapacityPoint {
        CapacityPoint {
            rate,
            requests: 10,
            completed: 10,
            error_rate: 0.0,
            request_throughput: rate,
            output_throughput: rate * 8.0,
            median_ttft_ms: 10.0,
            p99_ttft_ms: 20.0,
            median_e2el_ms: 100.0,
            p99_e2el_ms: 200.0,
            mean_concurrency: 0.1 * rate,
            max_concurrency: 1,
            pass,
            broken: if pass { vec![] } else { vec!["P99 TTFT 2000 ms > 1000 ms".into()] },
            errors: Default::default(),
        }
    }

    /// A server that holds the bounds up to `limit` sessions/s.
    fn search_against(limit: f64, o: &CapacityOptions) -> Vec<f64> {
        let mut pts = Vec::new();
        while let Some(r) = next_rate(&pts, o) {
            pts.push(point(r, r <= limit));
            assert!(pts.len() < 50, "the search must end");
        }
        pts.iter().map(|p| p.rate).collect()
    }

    #[test]
    fn the_search_doubles_then_bisects_to_the_resolution() {
        let o = opts();
        let rates = search_against(3.0, &o);
        assert_eq!(&rates[..4], [0.5, 1.0, 2.0, 4.0]);
        // Bisection between 2 (pass) and 4 (fail) until the gap is within 25%.
        let pass = rates.iter().copied().filter(|&r| r <= 3.0).fold(0.0, f64::max);
        let fail = rates.iter().copied().filter(|&r| r > 3.0).fold(f64::INFINITY, f64::min);
        assert!(fail / pass <= 1.25 && pass <= 3.0 && fail > 3.0, "{rates:?}");
        // A server that passes everything stops at max_rate; one that fails at once stops at once.
        assert_eq!(search_against(100.0, &o).last(), Some(&16.0));
        assert_eq!(search_against(0.1, &o), [0.5]);
    }

    fn record(start_s: f64, e2el_ms: f64, success: bool) -> RequestRecord {
        let r = RequestRecord::for_test(start_s, e2el_ms / 4.0, e2el_ms);
        if success {
            r
        } else {
            r.failed()
        }
    }

    #[test]
    fn a_step_is_judged_on_its_steady_window_only() {
        let o = opts();
        // A cold first request in the warm-up breaks every bound but is not judged.
        let mut rs = vec![record(0.0, 9000.0, true)];
        rs.extend((0..10).map(|i| record(5.0 + i as f64, 400.0, true)));
        let p = judge(1.0, &rs, 5.0, 10.0, &o);
        assert!(p.pass, "{p:?}");
        assert_eq!((p.requests, p.completed), (10, 10));
        assert!((p.request_throughput - 1.0).abs() < 1e-12);
        assert!((p.mean_concurrency - 0.4).abs() < 1e-9, "Little: 1/s x 0.4 s");
        assert_eq!(p.max_concurrency, 1);
        // Slow answers and errors break their bounds and say which.
        rs.push(record(6.0, 3000.0, true));
        rs.push(record(7.0, 100.0, false));
        let p = judge(1.0, &rs, 5.0, 10.0, &o);
        assert!(!p.pass);
        assert!(p.broken.iter().any(|b| b.starts_with("P99 E2EL")), "{p:?}");
        assert!(p.broken.iter().any(|b| b.starts_with("error rate")), "{p:?}");
        // At 7.0 s: the slow one from 6.0, the one from 7.0 and the failed one from 7.0.
        assert_eq!(p.max_concurrency, 3);
        let none = judge(1.0, &[record(6.0, 100.0, false)], 5.0, 10.0, &o);
        assert!(!none.pass && none.broken[0].contains("no request completed"));
        // A step that filled the client's slots is not a measurement of the server.
        let full = CapacityOptions { concurrency: 2, ..o.clone() };
        let p = judge(1.0, &[record(6.0, 100.0, true), record(6.05, 100.0, true)], 5.0, 10.0, &full);
        assert!(!p.pass && p.broken[0].contains("raise --concurrency"), "{p:?}");
        let wf = Workflow::from_yaml(
            "name: t\nmax_requests: 3\narrival: { rate: 1.0 }\nstart: a\nstates:\n  a:\n    prompts: [x]\n    retries: 2\n    qps: 1\n",
            "t.yaml",
        )
        .unwrap();
        let step = step_workflow(&wf, 4.0, &o);
        assert_eq!((step.states["a"].retries, step.states["a"].qps, step.arrival.rate), (0, None, 4.0));
        assert_eq!((step.max_requests, step.concurrency, step.rtt_backoff.is_none()), (None, 64, true));
    }

    #[test]
    fn the_knee_is_where_latency_turns_up() {
        let mut pts: Vec<CapacityPoint> =
            [(0.5, 200.0), (1.0, 210.0), (2.0, 230.0), (3.0, 400.0), (4.0, 2000.0)]
                .iter()
                .map(|&(r, y)| CapacityPoint { p99_e2el_ms: y, ..point(r, y < 1000.0) })
                .collect();
        assert_eq!(knee(&pts), Some(3.0));
        // A straight line has no knee, nor do two points.
        for (i, p) in pts.iter_mut().enumerate() {
            p.p99_e2el_ms = 100.0 * (i + 1) as f64;
        }
        assert_eq!(knee(&pts), None);
        assert_eq!(knee(&pts[..2]), None);
    }

    #[test]
    fn the_report_names_the_limit_and_draws_it() {
        let o = opts();
        let ctx = StepContext { model: "m".into(), endpoint: "e".into(), workflow: "w".into() };
        let r = CapacityReport::new(
            &ctx,
            vec![point(2.0, true), point(0.5, true), point(4.0, false), point(1.0, true)],
            &o,
        );
        assert_eq!(r.points.iter().map(|p| p.rate).collect::<Vec<_>>(), [0.5, 1.0, 2.0, 4.0]);
        assert_eq!(r.max_sustained.as_ref().map(|p| p.rate), Some(2.0));
        assert_eq!(r.first_failing.as_ref().map(|p| p.rate), Some(4.0));
        assert!(
            r.verdict.starts_with("sustains 2.000 sessions/s") && r.verdict.contains("P99 TTFT"),
            "{}",
            r.verdict
        );
        let svg = r.svg().unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("P99 E2EL bound") && svg.contains("highest passing rate")
        );
        let none = CapacityReport::new(&ctx, vec![point(0.5, false)], &o);
        assert!(none.max_sustained.is_none() && none.verdict.contains("--start-rate"), "{}", none.verdict);
        let capped = CapacityReport::new(&ctx, vec![point(16.0, true)], &o);
        assert!(capped.capped_at_max_rate && capped.verdict.contains("--max-rate"));
    }

    #[test]
    fn options_are_checked_by_name() {
        let mut o = opts();
        o.start_rate = 0.0;
        assert!(o.validate().unwrap_err().to_string().contains("--start-rate"));
        let mut o = opts();
        o.max_rate = 0.1;
        assert!(o.validate().unwrap_err().to_string().contains("--max-rate"));
        let mut o = opts();
        o.max_error_rate = 1.5;
        assert!(o.validate().unwrap_err().to_string().contains("--max-error-rate"));
    }
}
