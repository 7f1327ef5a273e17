//! Sending requests over pooled keep-alive connections that the server may close.

use std::error::Error as StdError;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// A stale pooled connection fails at once; a connection the server dropped later (a crash
/// mid-request) is a real failure and is not retried.
const STALE_WITHIN: Duration = Duration::from_secs(1);

/// Sends `request`, and sends it once more on a fresh connection when the first
/// attempt died because the server closed a pooled keep-alive connection.
///
/// A server (llama.cpp's cpp-httplib, uvicorn) may close an idle keep-alive
/// connection just as the client writes the next request on it; hyper then
/// reports "connection closed before message completed" and no response was
/// started. That failure says nothing about the server's health, so a probe or
/// scrape that reported it would raise a false alarm. Only a failure within
/// `STALE_WITHIN` of sending is retried; any other error, a status code, and a second
/// failure are returned as they are. Requests whose body cannot be cloned (streams)
/// are sent once. Returns the response and when the attempt that got it was sent, so
/// latencies exclude the stale attempt.
pub async fn send_retrying_stale(
    request: reqwest::RequestBuilder,
) -> Result<(reqwest::Response, Instant), reqwest::Error> {
    let started = Instant::now();
    let Some(again) = request.try_clone() else {
        return request.send().await.map(|r| (r, started));
    };
    match request.send().await {
        Err(e) if is_stale_connection(&e) && started.elapsed() < STALE_WITHIN => {
            let retried = Instant::now();
            again.send().await.map(|r| (r, retried))
        }
        other => other.map(|r| (r, started)),
    }
}

/// True when `e` is the peer closing the connection before any response arrived.
pub fn is_stale_connection(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() || e.is_status() || e.is_body() || e.is_decode() {
        return false;
    }
    let mut cause: Option<&(dyn StdError + 'static)> = e.source();
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A test that goes wrong fails on the timeout instead of hanging.
    fn client() -> reqwest::Client {
        reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok";

    /// Reads one request head (tests send GETs without a body).
    async fn read_head(s: &mut tokio::net::TcpStream) -> bool {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte).await {
                Ok(1) => buf.push(byte[0]),
                _ => return false,
            }
        }
        true
    }

    /// A server that answers the first request, then reads the next one on the same
    /// connection and closes it without answering (the race a keep-alive pool hits),
    /// then serves one request on a second connection.
    async fn server_that_drops_second_request() -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let handle = tokio::spawn(async move {
            // The first connection serves one request and drops the second.
            let (mut first, _) = listener.accept().await.unwrap();
            if read_head(&mut first).await {
                first.write_all(OK).await.unwrap();
            }
            read_head(&mut first).await;
            drop(first);
            // A retry comes on a new connection, which serves it.
            let (mut second, _) = listener.accept().await.unwrap();
            if read_head(&mut second).await {
                second.write_all(OK).await.unwrap();
            }
        });
        (url, handle)
    }

    #[tokio::test]
    async fn plain_send_fails_on_a_closed_keep_alive_connection() {
        let (url, _server) = server_that_drops_second_request().await;
        let client = client();
        assert_eq!(client.get(&url).send().await.unwrap().text().await.unwrap(), "ok");
        let e = client.get(&url).send().await.unwrap_err();
        assert!(is_stale_connection(&e), "{e:?}");
    }

    #[tokio::test]
    async fn retry_sends_once_more_on_a_fresh_connection() {
        let (url, server) = server_that_drops_second_request().await;
        let client = client();
        assert_eq!(send_retrying_stale(client.get(&url)).await.unwrap().0.text().await.unwrap(), "ok");
        let before = Instant::now();
        let (second, sent) =
            send_retrying_stale(client.get(&url)).await.expect("retried on a new connection");
        assert!(sent >= before);
        assert_eq!(second.text().await.unwrap(), "ok");
        server.await.expect("the server saw the dropped request and the retry");
    }

    #[tokio::test]
    async fn refused_connections_are_not_retried() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        drop(listener);
        let e = send_retrying_stale(client().get(&url)).await.unwrap_err();
        assert!(e.is_connect() && !is_stale_connection(&e), "{e:?}");
    }
}
