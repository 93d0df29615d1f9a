//! Accepting connections, with the bounds a server open to hostile
//! clients needs: a request head must arrive whole within the header
//! timeout (a client that goes silent or trickles its head, and a
//! keep-alive connection left idle, are closed), and at most
//! `max_connections` are open at once, `max_per_client` of them from one
//! address (one more is answered 503 and closed at once). The body's own
//! timeout is `body::read_json`'s.
//!
//! `axum::serve` builds hyper's connections without a timer, and hyper
//! then has no header timeout at all; this loop builds them itself.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::Service;

use crate::error::ApiError;

/// How long connections may take and how many may be open.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// From the first poll for a request head (a new connection, or one
    /// whose last response was written) to the head's last byte.
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_per_client: usize,
}

/// Open connections per client address.
#[derive(Debug, Default)]
struct PerClient(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

/// One counted connection; uncounted when dropped.
struct ClientSlot {
    clients: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    /// A slot for `ip`, unless it holds `max` already.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot { clients: self.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops
/// accepting and waits for the open connections: requests in flight
/// finish, idle connections close.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: wait a moment rather than spin.
                    eprintln!("server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, "too many open connections; try again shortly"));
            continue;
        };
        let Some(client_slot) = clients.take(peer.ip(), limits.max_per_client) else {
            tokio::spawn(refuse(stream, "too many open connections from this address; close some"));
            continue;
        };
        // Streamed tokens are small writes that should leave at once.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            // What `ConnectInfo<SocketAddr>` extracts (the rate limit's key
            // without an API key).
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().call(request)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // An error here is the client's (a reset, a bad or late head);
            // hyper has answered what could be answered.
            let _ = connection.await;
            drop((slot, client_slot));
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over the cap with 503 and closes it, without
/// reading its request: a flood of connections costs a write each.
async fn refuse(mut stream: TcpStream, message: &'static str) {
    let error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).code("too_many_connections");
    let body = serde_json::to_string(&error.body()).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}
