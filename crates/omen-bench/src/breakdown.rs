//! Where a request's time goes: TTFT split into queueing, prefill and the network/client
//! share, decode time per token, and prefill and decode tokens per second apart.
//!
//! The client's view (every bench report) times what a user sees. The server's view comes
//! from its own `/metrics`, scraped just before and just after the measured runs: the
//! differences of its histograms' `_sum` and `_count` are the means over the requests it
//! served in between, and the differences of their buckets give percentiles as
//! `histogram_quantile` would. vLLM exports per-phase histograms
//! (`vllm:request_queue_time_seconds`, `..._prefill_time_seconds`,
//! `..._decode_time_seconds`, `vllm:time_to_first_token_seconds`,
//! `vllm:e2e_request_latency_seconds`) and token counters; llama.cpp (`--metrics`) exports
//! prompt and generation token and second counters, which give the two speeds but no split
//! of TTFT. What the server does not export is listed under `missing`, never guessed.

use std::collections::BTreeMap;
use std::time::Duration;

use prom_text_format_parser::{Type, ValueType};
use serde::Serialize;

use crate::loadgen::RequestRecord;

/// vLLM's per-phase histograms, as (key in the report, metric family).
const VLLM_HISTOGRAMS: [(&str, &str); 5] = [
    ("queue_ms", "vllm:request_queue_time_seconds"),
    ("prefill_ms", "vllm:request_prefill_time_seconds"),
    ("decode_ms", "vllm:request_decode_time_seconds"),
    ("ttft_ms", "vllm:time_to_first_token_seconds"),
    ("e2e_ms", "vllm:e2e_request_latency_seconds"),
];
const VLLM_PROMPT_TOKENS: &str = "vllm:prompt_tokens";
const VLLM_GENERATION_TOKENS: &str = "vllm:generation_tokens";
const LLAMACPP_PROMPT_TOKENS: &str = "llamacpp:prompt_tokens";
const LLAMACPP_PROMPT_SECONDS: &str = "llamacpp:prompt_seconds";
const LLAMACPP_PREDICTED_TOKENS: &str = "llamacpp:tokens_predicted";
const LLAMACPP_PREDICTED_SECONDS: &str = "llamacpp:tokens_predicted_seconds";

/// One histogram family summed over its series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramTotal {
    /// Sum of the observations (seconds).
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
    /// Cumulative `(le, count)` buckets, sorted by bound, the last `+Inf`.
    pub buckets: Vec<(f64, f64)>,
}

/// The server's metrics at one moment: histogram and counter families summed over series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerTotals {
    /// Histograms by family name.
    pub histograms: BTreeMap<String, HistogramTotal>,
    /// Counters (and untyped families) by name without `_total`.
    pub counters: BTreeMap<String, f64>,
}

/// The server's metrics could not be read; names the URL and the fix.
#[derive(Debug, thiserror::Error)]
pub enum BreakdownError {
    /// The scrape failed.
    #[error("--server-metrics {url}: {reason}")]
    Scrape {
        /// The URL.
        url: String,
        /// What went wrong and what to do.
        reason: String,
    },
}

/// Parses a Prometheus text page into totals; `Err` names the first bad line.
pub fn parse_totals(text: &str) -> Result<ServerTotals, String> {
    let text = text.replace("\r\n", "\n");
    let (metrics, error) = prom_text_format_parser::parse_scrape(&text);
    if let Some(prom_text_format_parser::ScrapeParseError::Parse(reason)) = error {
        return Err(reason.lines().next().unwrap_or("unparsable").chars().take(200).collect());
    }
    let mut totals = ServerTotals::default();
    for m in metrics {
        match m.kind {
            Type::Histogram => {
                let h = totals.histograms.entry(m.name.clone()).or_default();
                let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
                for s in &m.samples {
                    let v = s.value.value.as_f64();
                    if !v.is_finite() {
                        continue;
                    }
                    match s.value.value_type {
                        ValueType::Sum => h.sum += v,
                        ValueType::Count => h.count += v,
                        ValueType::Sample => {
                            let le = s
                                .labels
                                .iter()
                                .find(|l| l.key == "le")
                                .and_then(|l| l.value.trim().parse::<f64>().ok());
                            if let Some(le) = le {
                                // Order-preserving key of a non-negative or infinite bound.
                                let key = if le.is_sign_negative() { 0 } else { le.to_bits() };
                                by_le.entry(key).or_insert((le, 0.0)).1 += v;
                            }
                        }
                    }
                }
                h.buckets = by_le.into_values().collect();
            }
            // Gauges go up and down, so only counters say how much happened in between.
            Type::Counter | Type::Untyped => {
                let name = m.name.strip_suffix("_total").unwrap_or(&m.name).to_owned();
                let sum: f64 =
                    m.samples.iter().map(|s| s.value.value.as_f64()).filter(|v| v.is_finite()).sum();
                *totals.counters.entry(name).or_default() += sum;
            }
            _ => {}
        }
    }
    Ok(totals)
}

/// Scrapes `url` (the server's `/metrics`) once.
pub async fn scrape(url: &str) -> Result<ServerTotals, BreakdownError> {
    let err = |reason: String| BreakdownError::Scrape { url: url.to_owned(), reason };
    let response =
        reqwest::Client::new().get(url).timeout(Duration::from_secs(10)).send().await.map_err(|e| {
            err(format!(
                "{}; check the URL and that the server exports /metrics (llama.cpp needs --metrics)",
                omen_sources::error_chain(&e)
            ))
        })?;
    if !response.status().is_success() {
        return Err(err(format!(
            "HTTP {}; give the server's Prometheus page, e.g. http://127.0.0.1:8000/metrics (llama.cpp needs --metrics)",
            response.status()
        )));
    }
    let text = response.text().await.map_err(|e| {
        err(format!("cannot read the page ({e}); check that the server is healthy and retry"))
    })?;
    parse_totals(&text).map_err(|line| err(format!("not a Prometheus text page ({line})")))
}

/// Mean and percentiles of one phase, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseMs {
    /// Mean.
    pub mean: f64,
    /// Median (histogram estimate on the server side).
    pub p50: f64,
    /// 99th percentile (histogram estimate on the server side).
    pub p99: f64,
    /// Server side: the histogram bucket holding the median, ms; the estimate is only as
    /// fine as it (a median of 150 in [0, 300] says "below 300").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_bucket: Option<[f64; 2]>,
    /// Server side: the bucket holding the 99th percentile, ms (`null` upper end: +Inf).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_bucket: Option<[f64; 2]>,
}

/// The client's view of the measured requests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientView {
    /// TTFT as the client saw it (queue + prefill + network + client).
    pub ttft_ms: Option<PhaseMs>,
    /// End-to-end latency.
    pub e2el_ms: Option<PhaseMs>,
    /// Decode time per output token after the first (mean TPOT).
    pub decode_ms_per_token: Option<f64>,
    /// Prompt tokens per second of TTFT: a lower bound on prefill speed (TTFT includes queueing).
    pub prefill_tokens_per_s: Option<f64>,
    /// Output tokens after the first per second after the first token.
    pub decode_tokens_per_s: Option<f64>,
}

/// The server's view, from its own metrics over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerView {
    /// The scraped URL.
    pub source: String,
    /// `vllm`, `llamacpp` or `unknown` (no known family found).
    pub kind: String,
    /// Requests the server finished in the window (every client's, not only the bench's).
    pub requests: Option<f64>,
    /// Per-phase means and percentiles, by `queue_ms`, `prefill_ms`, `decode_ms`, `ttft_ms`, `e2e_ms`.
    pub phases: BTreeMap<String, PhaseMs>,
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_s: Option<f64>,
    /// Generated tokens per second of decode.
    pub decode_tokens_per_s: Option<f64>,
    /// Decode time per generated token, ms.
    pub decode_ms_per_token: Option<f64>,
    /// What this server does not export, and so is not reported.
    pub missing: Vec<String>,
    /// The server restarted between the scrapes; its figures count from the restart.
    pub restarted: bool,
}

/// TTFT split by where the time went (means, ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TtftSplit {
    /// Waiting for a slot in the server's scheduler.
    pub queue: f64,
    /// Computing the prompt.
    pub prefill: f64,
    /// The rest of the client's TTFT: network, HTTP and SSE framing, the client itself.
    pub network_and_client: f64,
}

/// The latency breakdown of a bench report (`omen.latency_breakdown`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyBreakdown {
    /// What the client measured.
    pub client: ClientView,
    /// What the server measured, when its metrics were scraped.
    pub server: Option<ServerView>,
    /// The client's mean TTFT split into server phases and the rest (needs vLLM's histograms).
    pub ttft_split_ms: Option<TtftSplit>,
    /// Client mean E2EL minus the server's mean end-to-end latency, ms.
    pub e2e_network_and_client_ms: Option<f64>,
    /// Caveats a reader needs.
    pub notes: Vec<String>,
}

fn phase(values: &[f64]) -> Option<PhaseMs> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(PhaseMs {
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        p50: omen_signals::quantile_linear(&sorted, 0.5),
        p99: omen_signals::quantile_linear(&sorted, 0.99),
        p50_bucket: None,
        p99_bucket: None,
    })
}

/// The client's view of the successful `records`.
pub fn client_view(records: &[RequestRecord]) -> ClientView {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
    let e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2el_ms).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms).collect();
    let ttft_s: f64 = ok.iter().filter_map(|r| r.ttft_ms).sum::<f64>() / 1e3;
    let input: u64 = ok.iter().filter(|r| r.ttft_ms.is_some()).map(|r| r.input_tokens).sum();
    let (mut decode_tokens, mut decode_s) = (0.0, 0.0);
    for r in &ok {
        if let (Some(t), Some(e)) = (r.ttft_ms, r.e2el_ms) {
            if r.output_tokens > 1 {
                decode_tokens += (r.output_tokens - 1) as f64;
                decode_s += (e - t).max(0.0) / 1e3;
            }
        }
    }
    ClientView {
        ttft_ms: phase(&ttft),
        e2el_ms: phase(&e2el),
        decode_ms_per_token: (!tpot.is_empty()).then(|| tpot.iter().sum::<f64>() / tpot.len() as f64),
        prefill_tokens_per_s: (ttft_s > 0.0).then(|| input as f64 / ttft_s),
        decode_tokens_per_s: (decode_s > 0.0).then(|| decode_tokens / decode_s),
    }
}

fn delta_phase(before: Option<&HistogramTotal>, after: &HistogramTotal) -> Option<PhaseMs> {
    let empty = HistogramTotal::default();
    let before = before.unwrap_or(&empty);
    let count = after.count - before.count;
    if count <= 0.0 {
        return None;
    }
    let delta = delta_buckets(&before.buckets, &after.buckets);
    let q = |q: f64| omen_sources::scrape::bucket_quantile(q, &delta).map_or(f64::NAN, |s| s * 1e3);
    Some(PhaseMs {
        mean: (after.sum - before.sum) / count * 1e3,
        p50: q(0.5),
        p99: q(0.99),
        p50_bucket: bucket_holding(0.5, &delta),
        p99_bucket: bucket_holding(0.99, &delta),
    })
}

/// The cumulative buckets of the observations between two snapshots of one histogram; a
/// changed layout or a count that went down (a restart) counts from zero. Buckets are read
/// one by one, so the deltas are kept cumulative.
fn delta_buckets(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let same = before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.0 == a.0 && a.1 >= b.1);
    let mut running = 0.0f64;
    after
        .iter()
        .enumerate()
        .map(|(i, &(le, c))| {
            running = running.max(if same { c - before[i].1 } else { c });
            (le, running)
        })
        .collect()
}

/// The bounds (ms) of the bucket of `delta` that holds its `q` quantile.
fn bucket_holding(q: f64, delta: &[(f64, f64)]) -> Option<[f64; 2]> {
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let i = delta.iter().position(|&(_, c)| c >= q * total)?;
    let lower = if i == 0 { 0.0 } else { delta[i - 1].0 };
    Some([lower * 1e3, delta[i].0 * 1e3])
}

fn counter_delta(before: &ServerTotals, after: &ServerTotals, name: &str) -> Option<f64> {
    let a = *after.counters.get(name)?;
    let d = a - before.counters.get(name).copied().unwrap_or(0.0);
    (d >= 0.0).then_some(d)
}

/// The server's view between two scrapes of `source`.
pub fn server_view(source: &str, before: &ServerTotals, after: &ServerTotals) -> ServerView {
    // A count or counter that went down means the server restarted in between: its
    // figures then count from the restart.
    let restarted =
        after.histograms.iter().any(|(k, h)| before.histograms.get(k).is_some_and(|b| h.count < b.count))
            || after.counters.iter().any(|(k, &v)| before.counters.get(k).is_some_and(|&b| v < b));
    let empty = ServerTotals::default();
    let before = if restarted { &empty } else { before };
    let mut phases = BTreeMap::new();
    let mut missing = Vec::new();
    let is_vllm = after.histograms.keys().chain(after.counters.keys()).any(|k| k.starts_with("vllm:"));
    let is_llamacpp = after.counters.keys().any(|k| k.starts_with("llamacpp:"));
    let per_s = |tokens: Option<f64>, seconds: Option<f64>| match (tokens, seconds) {
        (Some(t), Some(s)) if s > 0.0 => Some(t / s),
        _ => None,
    };
    let (mut requests, mut prefill_tps, mut decode_tps, mut decode_ms_per_token) = (None, None, None, None);
    if is_vllm {
        for (key, family) in VLLM_HISTOGRAMS {
            match after.histograms.get(family).and_then(|h| delta_phase(before.histograms.get(family), h)) {
                Some(p) => {
                    phases.insert(key.to_owned(), p);
                }
                None => missing.push(format!("{key}: no {family} observations in the window")),
            }
        }
        let count = |family: &str| {
            let a = after.histograms.get(family)?.count;
            Some(a - before.histograms.get(family).map_or(0.0, |h| h.count))
        };
        let seconds = |family: &str| {
            let a = after.histograms.get(family)?.sum;
            Some(a - before.histograms.get(family).map_or(0.0, |h| h.sum))
        };
        requests = count("vllm:e2e_request_latency_seconds");
        let generated = counter_delta(before, after, VLLM_GENERATION_TOKENS);
        // The first token of each request is produced by the prefill step, not by decode.
        let decoded = match (generated, requests) {
            (Some(g), Some(n)) => Some((g - n).max(0.0)),
            _ => None,
        };
        prefill_tps = per_s(
            counter_delta(before, after, VLLM_PROMPT_TOKENS),
            seconds("vllm:request_prefill_time_seconds"),
        );
        let decode_s = seconds("vllm:request_decode_time_seconds");
        decode_tps = per_s(decoded, decode_s);
        decode_ms_per_token = match (decode_s, decoded) {
            (Some(s), Some(t)) if t > 0.0 => Some(s / t * 1e3),
            _ => None,
        };
    } else if is_llamacpp {
        missing.push("queue_ms, prefill_ms, decode_ms, ttft_ms, e2e_ms: llama.cpp exports no per-request phase histograms".into());
        let predicted = counter_delta(before, after, LLAMACPP_PREDICTED_TOKENS);
        let predicted_s = counter_delta(before, after, LLAMACPP_PREDICTED_SECONDS);
        prefill_tps = per_s(
            counter_delta(before, after, LLAMACPP_PROMPT_TOKENS),
            counter_delta(before, after, LLAMACPP_PROMPT_SECONDS),
        );
        decode_tps = per_s(predicted, predicted_s);
        decode_ms_per_token = match (predicted_s, predicted) {
            (Some(s), Some(t)) if t > 0.0 => Some(s / t * 1e3),
            _ => None,
        };
    } else {
        missing.push("every phase: no vLLM (vllm:*) or llama.cpp (llamacpp:*) metric on this page".into());
    }
    ServerView {
        source: source.to_owned(),
        kind: if is_vllm {
            "vllm"
        } else if is_llamacpp {
            "llamacpp"
        } else {
            "unknown"
        }
        .to_owned(),
        requests,
        phases,
        prefill_tokens_per_s: prefill_tps,
        decode_tokens_per_s: decode_tps,
        decode_ms_per_token,
        missing,
        restarted,
    }
}

/// The breakdown of `records`, with the server's view when it was scraped.
pub fn breakdown(records: &[RequestRecord], server: Option<ServerView>) -> LatencyBreakdown {
    let client = client_view(records);
    let mut notes = Vec::new();
    let (mut split, mut e2e_rest) = (None, None);
    if let Some(s) = &server {
        if s.restarted {
            notes.push("the server restarted during the run (a counter went down): its figures count from the restart only".into());
        }
        let completed = records.iter().filter(|r| r.success).count() as f64;
        if let Some(n) = s.requests {
            if n > completed {
                notes.push(format!(
                    "the server finished {n:.0} requests in the window and the bench {completed:.0}: its figures include other clients' requests (e.g. omen's canaries)"
                ));
            }
        }
        if let (Some(c), Some(q), Some(p)) =
            (&client.ttft_ms, s.phases.get("queue_ms"), s.phases.get("prefill_ms"))
        {
            // The server's own TTFT when it has one, else its queue and prefill phases.
            let server_ttft = s.phases.get("ttft_ms").map_or(q.mean + p.mean, |t| t.mean);
            split =
                Some(TtftSplit { queue: q.mean, prefill: p.mean, network_and_client: c.mean - server_ttft });
        }
        if let (Some(c), Some(e)) = (&client.e2el_ms, s.phases.get("e2e_ms")) {
            e2e_rest = Some(c.mean - e.mean);
        }
    } else {
        notes.push("client view only: pass --server-metrics URL (the server's /metrics) to split TTFT into queueing and prefill".into());
    }
    LatencyBreakdown { client, server, ttft_split_ms: split, e2e_network_and_client_ms: e2e_rest, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page a real vLLM 0.32 served (kept gzipped beside the scraper's tests).
    fn vllm_page() -> String {
        use std::io::Read as _;
        let gz: &[u8] = include_bytes!("../../omen-sources/tests/data/vllm-0.32-metrics.txt.gz");
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz).read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn a_real_vllm_page_sums_its_families() {
        let t = parse_totals(&vllm_page()).unwrap();
        let q = &t.histograms["vllm:request_queue_time_seconds"];
        assert!(q.count > 0.0 && q.sum >= 0.0, "{q:?}");
        assert_eq!(q.buckets.last().map(|b| b.0), Some(f64::INFINITY));
        assert!(q.buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{:?}", q.buckets);
        assert_eq!(q.buckets.last().unwrap().1, q.count);
        assert!(t.counters["vllm:prompt_tokens"] > 0.0);
        assert!(t.counters["vllm:generation_tokens"] > 0.0);
    }

    /// A page with `n` requests of 0.1 s queue, 0.2 s prefill, 1.0 s decode, 0.3 s TTFT, 1.3 s
    /// e2e, 50 prompt and 11 generated tokens each.
    fn page(n: f64) -> String {
        let mut s = String::new();
        for (family, each) in [
            ("vllm:request_queue_time_seconds", 0.1),
            ("vllm:request_prefill_time_seconds", 0.2),
            ("vllm:request_decode_time_seconds", 1.0),
            ("vllm:time_to_first_token_seconds", 0.3),
            ("vllm:e2e_request_latency_seconds", 1.3),
        ] {
            s += &format!("# TYPE {family} histogram\n");
            for le in ["0.05", "0.15", "0.25", "0.5", "2.0", "+Inf"] {
                let c = if le == "+Inf" || le.parse::<f64>().unwrap() >= each { n } else { 0.0 };
                s += &format!("{family}_bucket{{engine=\"0\",le=\"{le}\"}} {c}\n");
            }
            s += &format!("{family}_sum{{engine=\"0\"}} {}\n{family}_count{{engine=\"0\"}} {n}\n", each * n);
        }
        s += &format!(
            "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{engine=\"0\"}} {}\n",
            50.0 * n
        );
        s += &format!(
            "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{engine=\"0\"}} {}\n",
            11.0 * n
        );
        s
    }

    fn record(ttft_ms: f64, e2el_ms: f64) -> RequestRecord {
        RequestRecord {
            tpot_ms: Some((e2el_ms - ttft_ms) / 10.0),
            input_tokens: 50,
            output_tokens: 11,
            ..RequestRecord::for_test(0.0, ttft_ms, e2el_ms)
        }
    }

    #[test]
    fn the_window_between_two_scrapes_splits_ttft() {
        let (before, after) = (parse_totals(&page(10.0)).unwrap(), parse_totals(&page(14.0)).unwrap());
        let server = server_view("http://x/metrics", &before, &after);
        assert_eq!(server.kind, "vllm");
        assert_eq!(server.requests, Some(4.0));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(server.phases["queue_ms"].mean, 100.0));
        assert!(close(server.phases["prefill_ms"].mean, 200.0));
        // Every queue observation lies in (0.05, 0.15]: the estimate interpolates inside it.
        let p99 = server.phases["queue_ms"].p99;
        assert!(p99 > 50.0 && p99 <= 150.0, "{p99}");
        assert_eq!(server.phases["queue_ms"].p99_bucket, Some([50.0, 150.0]));
        assert_eq!(server.phases["e2e_ms"].p50_bucket, Some([500.0, 2000.0]));
        // 200 prompt tokens in 0.8 s of prefill; 40 decoded tokens (44 generated - 4 first) in 4 s.
        assert!(close(server.prefill_tokens_per_s.unwrap(), 250.0));
        assert!(close(server.decode_tokens_per_s.unwrap(), 10.0));
        assert!(close(server.decode_ms_per_token.unwrap(), 100.0));
        assert!(server.missing.is_empty(), "{:?}", server.missing);
        // The client saw 0.35 s TTFT and 1.4 s E2EL: 50 ms of TTFT and 100 ms of E2EL are outside the server.
        let records: Vec<RequestRecord> = (0..4).map(|_| record(350.0, 1400.0)).collect();
        let b = breakdown(&records, Some(server));
        let split = b.ttft_split_ms.unwrap();
        assert!(
            close(split.queue, 100.0) && close(split.prefill, 200.0) && close(split.network_and_client, 50.0),
            "{split:?}"
        );
        assert!(close(b.e2e_network_and_client_ms.unwrap(), 100.0));
        assert!(b.notes.is_empty(), "{:?}", b.notes);
        // A restart between the scrapes (counts went down) counts from zero and is said.
        let restarted = server_view("u", &after, &parse_totals(&page(3.0)).unwrap());
        assert!(restarted.restarted && restarted.requests == Some(3.0), "{restarted:?}");
        assert!(breakdown(&records, Some(restarted)).notes[0].contains("restarted"));
        // Other clients' requests in the window are said.
        let more = breakdown(&records[..2], Some(server_view("u", &before, &after)));
        assert!(more.notes[0].contains("other clients"), "{:?}", more.notes);
    }

    #[test]
    fn llamacpp_gives_speeds_and_says_what_it_lacks() {
        let page = |tokens: f64, secs: f64| {
            format!(
                "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total {tokens}\n\
                 # TYPE llamacpp:prompt_seconds_total counter\nllamacpp:prompt_seconds_total {secs}\n\
                 # TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total {}\n\
                 # TYPE llamacpp:tokens_predicted_seconds_total counter\nllamacpp:tokens_predicted_seconds_total {}\n",
                tokens / 2.0,
                secs * 2.0
            )
        };
        let (before, after) =
            (parse_totals(&page(100.0, 1.0)).unwrap(), parse_totals(&page(300.0, 2.0)).unwrap());
        let s = server_view("u", &before, &after);
        assert_eq!(s.kind, "llamacpp");
        assert_eq!(s.prefill_tokens_per_s, Some(200.0));
        assert_eq!(s.decode_tokens_per_s, Some(50.0));
        assert!(s.phases.is_empty() && s.missing[0].contains("no per-request phase histograms"));
        let b = breakdown(&[record(100.0, 200.0)], Some(s));
        assert!(b.ttft_split_ms.is_none());
        let none = breakdown(&[record(100.0, 200.0)], None);
        assert!(none.notes[0].contains("--server-metrics"));
        let c = none.client;
        assert_eq!(c.prefill_tokens_per_s, Some(500.0), "50 tokens in 0.1 s");
        assert_eq!(c.decode_tokens_per_s, Some(100.0), "10 tokens in 0.1 s");
        assert!(parse_totals("garbage{{{ 1\n").is_err());
        let unknown = server_view(
            "u",
            &ServerTotals::default(),
            &parse_totals("# TYPE x counter\nx_total 1\n").unwrap(),
        );
        assert_eq!(unknown.kind, "unknown");
    }
}
