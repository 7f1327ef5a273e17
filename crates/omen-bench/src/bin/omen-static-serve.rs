//! The reference server of `scripts/bench-agent.sh`: answers every GET with one fixed body
//! through the same HTTP stack as the agent (tokio's multi-thread runtime, axum, the
//! agent's own `Accept-Encoding` rule and headers), so that the agent's query figures can
//! be stated as ratios to what that stack does with no work behind it, on the same machine
//! in the same run.
//!
//! The benchmark saves the agent's own answer (and its gzip form) and serves those bytes,
//! so the reference sends exactly as many bytes per response as the agent does.
//!
//! ```text
//! omen-static-serve --body latest.json --gzip-body latest.json.gz --listen 127.0.0.1:9555
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Serves one fixed body on every GET path (the benchmark's same-stack reference)")]
struct Args {
    /// The body to send (as identity).
    #[arg(long)]
    body: PathBuf,
    /// The same body gzip-compressed, sent when the client accepts gzip (as the agent's
    /// /scores/latest does); without it every client gets the identity body.
    #[arg(long)]
    gzip_body: Option<PathBuf>,
    /// Address to listen on; loopback only unless --allow-non-loopback.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Allow a listen address that is not loopback.
    #[arg(long)]
    allow_non_loopback: bool,
}

fn read(path: &PathBuf, what: &str) -> Result<Bytes> {
    let bytes = std::fs::read(path).with_context(|| {
        format!("cannot read the {what} {}: give a file the benchmark saved", path.display())
    })?;
    if bytes.is_empty() {
        bail!("the {what} {} is empty: a reference needs the agent's non-empty answer", path.display());
    }
    Ok(Bytes::from(bytes))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !args.allow_non_loopback && !args.listen.ip().is_loopback() {
        bail!("--listen {} is not loopback; pass --allow-non-loopback to serve elsewhere", args.listen);
    }
    let identity = read(&args.body, "--body")?;
    let gzip = args.gzip_body.as_ref().map(|p| read(p, "--gzip-body")).transpose()?;
    let handler = move |headers: HeaderMap| {
        let (identity, gzip) = (identity.clone(), gzip.clone());
        async move { answer(&headers, identity, gzip) }
    };
    let app = Router::new().fallback(axum::routing::get(handler));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}: is the port taken?", args.listen))?;
    // The bound address on stdout (one line), for callers that ask for port 0.
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the server stopped")
}

/// The agent's /scores/latest headers, with the gzip body when the client accepts it.
fn answer(headers: &HeaderMap, identity: Bytes, gzip: Option<Bytes>) -> Response {
    let wants_gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .any(|v| v.to_str().is_ok_and(omen_agent::http::accepts_gzip));
    match gzip {
        Some(gz) if wants_gzip => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CONTENT_ENCODING, "gzip"),
                (header::VARY, "accept-encoding"),
            ],
            gz,
        )
            .into_response(),
        _ => ([(header::CONTENT_TYPE, "application/json"), (header::VARY, "accept-encoding")], identity)
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_only_for_clients_that_accept_it_and_only_when_given() {
        let (id, gz) = (Bytes::from_static(b"{}"), Bytes::from_static(b"\x1f\x8b"));
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, "gzip, deflate".parse().unwrap());
        let r = answer(&h, id.clone(), Some(gz.clone()));
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        let r = answer(&h, id.clone(), None);
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        let r = answer(&HeaderMap::new(), id, Some(gz));
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(r.headers()[header::VARY], "accept-encoding");
    }
}
