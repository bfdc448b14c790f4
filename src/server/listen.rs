//! The listeners: each accepted connection handshaken (TLS, or plain for the admin port) and
//! served with its port's service, within the limits, until stopped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::response::Response;
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use super::app::Limits;
use super::slots::Slots;

/// How a port turns an accepted TCP connection into the stream HTTP is spoken on.
#[derive(Clone)]
pub(super) enum Handshake {
    Tls(TlsAcceptor),
    /// The admin port: plain HTTP/1.1.
    Plain,
}

/// What a port serves each request with: a hyper service, made for each connection, that
/// answers every request (errors are answers too) with a future that can move between threads.
pub(crate) trait HttpService:
    Service<http::Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<http::Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// Accepts connections until stopped, each served with the service `service_for` makes for its
/// client, within `limits`: at most `max_connections` open, `max_connections_per_peer` of them
/// from one address (one beyond is closed at once), the handshake within its timeout, a first
/// request within the header timeout, and no connection left open idle longer than that,
/// whatever the HTTP version. Then waits for the open connections to finish.
pub(super) async fn serve<S: HttpService>(
    listener: TcpListener,
    handshake: Handshake,
    service_for: impl Fn(SocketAddr) -> S + Send + 'static,
    limits: Limits,
    refused: prometheus_client::metrics::counter::Counter,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Slots::new(limits.max_connections, limits.max_connections_per_peer);
    let mut http = auto::Builder::new(TokioExecutor::new());
    // Headers trickled are cut off by `Activity::bound` (no request in flight for the header
    // timeout): hyper's own deadline would arm a timer for every request on a keep-alive connection.
    http.http1().header_read_timeout(None);
    // The API server opens few streams per connection; a client opening many only holds memory.
    http.http2().timer(TokioTimer::new()).max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    if matches!(handshake, Handshake::Plain) {
        http = http.http1_only();
    }
    loop {
        let (tcp, peer) = tokio::select! {
            () = until_stopped(&mut stopped) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let open = match slots.take(peer.ip()) {
            Ok(slot) => slot,
            // Closed at once: cheaper than a handshake, and the client learns now, not at its timeout.
            Err(full) => {
                refused.inc();
                debug!(%peer, ?full, "connection limit reached: closed");
                continue;
            }
        };
        let (handshake, http, service, watcher) =
            (handshake.clone(), http.clone(), service_for(peer), graceful.watcher());
        // Answers are small and go out whole: do not hold them back waiting for an ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        tokio::spawn(async move {
            let activity = Arc::new(Activity::new());
            let service = activity.clone().around(service);
            let result = match handshake {
                Handshake::Plain => {
                    let connection = http.serve_connection(TokioIo::new(tcp), service);
                    activity
                        .bound(watcher.watch(connection), limits.header_read_timeout, limits.keep_alive_timeout)
                        .await
                }
                Handshake::Tls(acceptor) => {
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            activity.touch();
                            let connection = http.serve_connection(TokioIo::new(stream), service);
                            let first = limits.header_read_timeout;
                            activity.bound(watcher.watch(connection), first, limits.keep_alive_timeout).await
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            match result {
                Some(Err(e)) => debug!(%peer, error = %e, "connection closed with an error"),
                None => debug!(%peer, "connection idle too long, or no request in time: closed"),
                Some(Ok(())) => {}
            }
            // The connection's slot: moved in here so it is held until the connection ends.
            drop(open);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Streams one HTTP/2 connection may carry at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 32;

/// What a connection is doing: requests being answered, and when it last did anything.
struct Activity {
    in_flight: std::sync::atomic::AtomicUsize,
    since: parking_lot::Mutex<Instant>,
    /// Whether it has answered a request yet.
    answered: std::sync::atomic::AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Activity { in_flight: 0.into(), since: parking_lot::Mutex::new(Instant::now()), answered: false.into() }
    }

    fn touch(&self) {
        *self.since.lock() = Instant::now();
    }

    /// `service`, counting the requests it answers on this connection.
    fn around(self: Arc<Self>, service: impl HttpService) -> impl HttpService {
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let (activity, service) = (self.clone(), service.clone());
            async move {
                activity.in_flight.fetch_add(1, Ordering::Relaxed);
                let response = service.call(request).await;
                activity.touch();
                activity.answered.store(true, Ordering::Relaxed);
                activity.in_flight.fetch_sub(1, Ordering::Relaxed);
                response
            }
        })
    }

    /// Runs the connection until it ends (`Some`), or until it has had nothing in flight for
    /// `first` before its first answer (a client that sends nothing), `idle` after it (`None`:
    /// dropped, which closes it).
    async fn bound<F: Future>(&self, connection: F, first: Duration, kept_alive: Duration) -> Option<F::Output> {
        tokio::pin!(connection);
        // Asked again at each wake: the first answer may have come since the sleep began.
        let idle = || if self.answered.load(Ordering::Relaxed) { kept_alive } else { first };
        loop {
            let last = *self.since.lock();
            tokio::select! {
                result = &mut connection => return Some(result),
                () = tokio::time::sleep_until((last + idle()).into()) => {
                    let quiet = self.since.lock().elapsed() >= idle();
                    if quiet && self.in_flight.load(Ordering::Relaxed) == 0 {
                        return None;
                    }
                    if self.in_flight.load(Ordering::Relaxed) > 0 {
                        // Busy: a request is bounded by its own deadlines; look again later.
                        self.touch();
                    }
                }
            }
        }
    }
}

/// Returns once `true` was sent, or the sender is gone.
pub(super) async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}
