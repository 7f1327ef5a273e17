//! The fuzz targets: each takes arbitrary bytes to one parser that outside input reaches,
//! the way the agent calls it. A target may reject its input; it must never panic, hang or
//! allocate without bound. The binaries in src/bin wrap them for AFL++; `replay` runs a
//! corpus through them without AFL (a regression test).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt as _;

/// Agent clock for targets that need one (2026-11-02T10:00:00Z).
const NOW_MS: i64 = 1_793_613_600_000;

/// One fuzz target: arbitrary bytes in, nothing out (a panic is the failure).
pub type Target = fn(&[u8]);

/// Every target, by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("ingest", ingest),
    ("prom_text", prom_text),
    ("slots", slots),
    ("sse", sse),
    ("config_yaml", config_yaml),
    ("trace_jsonl", trace_jsonl),
    ("nsys_sqlite", nsys_sqlite),
    ("scores_query", scores_query),
];

/// `POST /v1/ingest/{kvcache,logits,samples}`: the first byte picks the endpoint.
pub fn ingest(data: &[u8]) {
    use omen_sources::ingest::*;
    let Some((&which, body)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            if let Ok(p) = serde_json::from_slice::<KvCachePayload>(body) {
                let _ = kvcache_samples(&p, NOW_MS);
            }
        }
        1 => {
            if let Ok(p) = serde_json::from_slice::<LogitsPayload>(body) {
                let _ = logits_samples(&p, NOW_MS);
            }
        }
        _ => {
            if let Ok(p) = serde_json::from_slice::<SamplesPayload>(body) {
                let _ = generic_samples(&p, NOW_MS);
            }
        }
    }
}

/// A server's `/metrics` page, scraped twice (the input split at the first `\n#--\n`), so that
/// the deltas between scrapes (rates, interval quantiles, ratios) run too.
pub fn prom_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut scraper = omen_sources::Scraper::new("http://127.0.0.1:9/metrics").expect("a valid URL");
    let mut pages = text.splitn(2, "\n#--\n");
    for (i, page) in pages.by_ref().enumerate() {
        let _ = scraper.ingest(page, NOW_MS + i as i64 * 15_000);
        let _ = scraper.changed_warnings();
    }
}

/// llama.cpp's `GET /slots` answer.
pub fn slots(data: &[u8]) {
    let _ = omen_sources::scrape::slots_samples(&String::from_utf8_lossy(data), NOW_MS);
}

/// A completion stream as the canary reads it: the SSE framing (in two network chunks)
/// and each event's JSON, with an RCI reference when the first byte is odd.
pub fn sse(data: &[u8]) {
    let Some((&flags, body)) = data.split_first() else { return };
    let (a, b) = body.split_at(body.len() / 2);
    let chunks = vec![
        Ok::<_, std::convert::Infallible>(bytes::Bytes::copy_from_slice(a)),
        Ok(bytes::Bytes::copy_from_slice(b)),
    ];
    let mut rci = (flags & 1 == 1).then(|| {
        let reference =
            Arc::new(omen_signals::BleuReference::new(&["The capital of France is Paris."]).unwrap());
        omen_signals::StreamingRci::new(reference, omen_signals::RciWeights::default())
    });
    let mut state = omen_sources::canary::StreamState::default();
    futures_executor::block_on(async {
        let mut events = eventsource_stream::Eventsource::eventsource(futures_util::stream::iter(chunks));
        while let Some(event) = events.next().await {
            let Ok(event) = event else { return };
            match state.on_data(&event.data, rci.as_mut()) {
                Ok(omen_sources::canary::Event::Done) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
}

/// `omen.yaml`.
pub fn config_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = omen_agent::config::Config::from_yaml(text) {
        let _ = cfg.validate();
    }
}

/// A recorded trace (JSON lines).
pub fn trace_jsonl(data: &[u8]) {
    for sample in omen_sources::trace::read_jsonl_trace(std::io::Cursor::new(data)).take(100_000) {
        let _ = sample;
    }
}

/// An Nsight Systems SQLite export, as `omen replay --nsys` reads it.
pub fn nsys_sqlite(data: &[u8]) {
    let Ok(mut file) = tempfile::NamedTempFile::new() else { return };
    if std::io::Write::write_all(&mut file, data).is_err() {
        return;
    }
    let _ = omen_sources::nsys::arena_samples(file.path(), 1000);
}

/// A `/scores` query string, decoded as axum's `Query` decodes it.
pub fn scores_query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(pairs) = serde_urlencoded::from_str::<Vec<(String, String)>>(text) else { return };
    let q: HashMap<String, String> = pairs.into_iter().collect();
    let _ = omen_agent::http::parse_range_query(q, NOW_MS);
}
