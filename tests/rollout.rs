//! Restarts under load: SIGTERM turns readiness down first, keeps answering through
//! `--shutdown-delay`, closes keep-alive connections after their answer, then refuses new
//! ones; a rolling restart of two replicas behind one address (a balancer that follows
//! `/readyz`, as a Service does) fails no request.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::Process;
use common::{Sender, admin_get, ca_of, connect, fixture, http1, post_request, review_allowed};
use hyper::body::Bytes;
use rustls_pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};

const DELAY: &str = "400ms";

fn replica(dir: &Path) -> Process {
    Process::serve(dir, &["--no-cluster", "--shutdown-delay", DELAY])
}

/// The status of `GET /readyz`, or None when the admin port does not answer.
async fn readyz(admin: SocketAddr) -> Option<u16> {
    admin_get(admin, "/readyz").await.ok().map(|answer| answer.status)
}

/// One address in front of the replicas: each new connection goes to the next replica whose
/// `/readyz` said 200 at the last look (every 20 ms), as kube-proxy does with a Service's
/// ready endpoints.
#[derive(Clone, Default)]
struct Balancer {
    /// (webhook, admin, ready)
    replicas: Arc<Mutex<Vec<(SocketAddr, SocketAddr, bool)>>>,
    next: Arc<AtomicUsize>,
}

impl Balancer {
    async fn start(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let balancer = self.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let Some(target) = balancer.pick() else { continue };
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else { return };
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        let balancer = self.clone();
        tokio::spawn(async move {
            loop {
                let admins: Vec<SocketAddr> = balancer.replicas.lock().unwrap().iter().map(|r| r.1).collect();
                for admin in admins {
                    let ready = readyz(admin).await == Some(200);
                    for replica in balancer.replicas.lock().unwrap().iter_mut().filter(|r| r.1 == admin) {
                        replica.2 = ready;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        addr
    }

    fn add(&self, replica: &Process) {
        self.replicas.lock().unwrap().push((replica.webhook, replica.admin, false));
    }

    fn remove(&self, replica: &Process) {
        self.replicas.lock().unwrap().retain(|r| r.0 != replica.webhook);
    }

    fn pick(&self) -> Option<SocketAddr> {
        let ready: Vec<SocketAddr> = self.replicas.lock().unwrap().iter().filter(|r| r.2).map(|r| r.0).collect();
        (!ready.is_empty()).then(|| ready[self.next.fetch_add(1, Ordering::Relaxed) % ready.len()])
    }

    async fn wait_ready(&self, replica: &Process) {
        common::eventually("the balancer sees the replica ready", async || {
            self.replicas.lock().unwrap().iter().any(|r| r.0 == replica.webhook && r.2).then_some(())
        })
        .await
    }
}

#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    failed: Mutex<Vec<String>>,
}

/// Reviews back to back on a keep-alive connection, as the API server sends them; a new
/// connection when the server closed the last one after its answer.
async fn keep_reviewing(addr: SocketAddr, ca: CertificateDer<'static>, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let body = Bytes::from(serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap());
    let mut sender: Option<Sender> = None;
    while !stop.load(Ordering::Relaxed) {
        let result = async {
            let mut connection = match sender.take() {
                Some(open) => open,
                None => {
                    http1(connect(addr, std::slice::from_ref(&ca), &[b"http/1.1"]).await.map_err(|e| e.to_string())?)
                        .await
                }
            };
            let answer = review_allowed(&mut connection, body.clone()).await?;
            let closes = answer.headers.get("connection").is_some_and(|v| v == "close");
            Ok((!closes).then_some(connection))
        }
        .await;
        match result {
            Ok(open) => {
                tally.answered.fetch_add(1, Ordering::Relaxed);
                sender = open;
            }
            Err(e) => tally.failed.lock().unwrap().push(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_two_replicas_under_load_fails_no_request() {
    let dir = tempfile::tempdir().unwrap();
    common::process::certs(dir.path());
    let ca = ca_of(&dir.path().join("certs"));
    let balancer = Balancer::default();
    let address = balancer.start().await;
    let mut old = vec![replica(dir.path()), replica(dir.path())];
    for replica in &old {
        balancer.add(replica);
        balancer.wait_ready(replica).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let load: Vec<_> =
        (0..4).map(|_| tokio::spawn(keep_reviewing(address, ca.clone(), stop.clone(), tally.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // As a Deployment with maxUnavailable 0 rolls: a new replica ready, then an old one stopped.
    let mut new = Vec::new();
    while let Some(mut retiring) = old.pop() {
        let replacement = replica(dir.path());
        balancer.add(&replacement);
        balancer.wait_ready(&replacement).await;
        new.push(replacement);
        let before = tally.answered.load(Ordering::Relaxed);
        retiring.signal("TERM");
        let exit = tokio::task::spawn_blocking(move || (retiring.wait_exit(), retiring)).await.unwrap();
        assert_eq!(exit.0.code(), Some(0));
        balancer.remove(&exit.1);
        assert!(tally.answered.load(Ordering::Relaxed) > before, "answers kept coming while a replica stopped");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in load {
        worker.await.unwrap();
    }

    assert_eq!(*tally.failed.lock().unwrap(), Vec::<String>::new());
    assert!(tally.answered.load(Ordering::Relaxed) > 100, "{} answers", tally.answered.load(Ordering::Relaxed));
}

#[tokio::test]
async fn after_sigterm_new_connections_are_refused_only_once_readiness_is_down_and_the_delay_is_over() {
    let dir = tempfile::tempdir().unwrap();
    common::process::certs(dir.path());
    let ca = ca_of(&dir.path().join("certs"));
    let replica = replica(dir.path());
    assert_eq!(readyz(replica.admin).await, Some(200));
    let mut keep_alive =
        http1(connect(replica.webhook, std::slice::from_ref(&ca), &[b"http/1.1"]).await.unwrap()).await;

    replica.signal("TERM");
    replica.wait_for_log("unready; still serving until the shutdown delay is over");
    assert_eq!(readyz(replica.admin).await, Some(503), "readiness goes down first");
    let answer = common::send(
        &mut keep_alive,
        post_request("/validate", serde_json::to_vec(&fixture("pod-delete-by-user.json")).unwrap()),
    )
    .await;
    assert_eq!(
        (answer.status, answer.headers.get("connection").map(|v| v.to_str().unwrap())),
        (200, Some("close")),
        "answered, and told to reconnect"
    );
    assert!(
        connect(replica.webhook, std::slice::from_ref(&ca), &[b"http/1.1"]).await.is_ok(),
        "new connections still taken during the delay"
    );

    common::eventually("new connections refused", async || {
        connect(replica.webhook, std::slice::from_ref(&ca), &[b"http/1.1"]).await.is_err().then_some(())
    })
    .await;
}
