//! A TCP proxy in front of the database (for the tests and the benchmark,
//! not used by the daemon), one core with two behaviours:
//! - [`Proxy::link`]: a slow, flaky link: a one-way delay and a bandwidth
//!   shared by all connections in each direction (like `tc netem`, which
//!   needs root and a network namespace these machines do not give a test);
//! - [`Proxy::faults`]: the database's own failures, injected into its
//!   commands ([`faults`]).
//!
//! Both have the switch that cuts every connection and refuses new ones
//! until the link is restored, count the bytes carried each way, and (the
//! link) can lose what one side sends while the connection stays open, the
//! way a dying connection does ([`Proxy::lose`]): the MQTT tests put one
//! between palletd and the broker to lose PUBACKs or PUBLISHes.

pub mod faults;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How the link behaves.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Delay each way (half the round trip).
    pub one_way: Duration,
    /// Bytes per second each way; 0 for no limit.
    pub bytes_per_sec: u64,
}

/// One direction of the link: when it is free to send the next byte.
#[derive(Debug)]
struct Pipe {
    free_at: Mutex<Instant>,
    bytes: AtomicU64,
    /// What comes in is dropped instead of carried.
    losing: AtomicBool,
    /// Bytes dropped so.
    lost: AtomicU64,
}

impl Pipe {
    /// When a chunk of `n` bytes sent now arrives at the far end.
    fn schedule(&self, link: &Link, n: usize) -> Instant {
        let mut free = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let start = (*free).max(Instant::now());
        let sending = match link.bytes_per_sec {
            0 => Duration::ZERO,
            bps => Duration::from_secs_f64(n as f64 / bps as f64),
        };
        *free = start + sending;
        self.count(n);
        start + sending + link.one_way
    }

    fn count(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// What the proxy does with what it carries.
#[derive(Debug, Clone)]
enum Behaviour {
    Link(Link),
    Faults(Arc<faults::Plan>),
}

#[derive(Debug)]
struct Shared {
    behaviour: Behaviour,
    up: AtomicBool,
    /// Cancelled when the link is cut; replaced when it is restored.
    cut: Mutex<CancellationToken>,
    /// One per connection carried (children of `cut`), oldest first.
    conns: Mutex<Vec<CancellationToken>>,
    to_server: Pipe,
    to_client: Pipe,
}

/// The proxy; dropping it stops it.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Proxy {
    /// A slow, flaky link on a free port of 127.0.0.1 to `upstream`.
    pub async fn link(upstream: u16, link: Link) -> std::io::Result<Proxy> {
        Self::start(upstream, Behaviour::Link(link)).await
    }

    /// A proxy to `upstream` that injects the faults `plan` says.
    pub async fn faults(upstream: u16, plan: Arc<faults::Plan>) -> std::io::Result<Proxy> {
        Self::start(upstream, Behaviour::Faults(plan)).await
    }

    async fn start(upstream: u16, behaviour: Behaviour) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let pipe = || Pipe {
            free_at: Mutex::new(Instant::now()),
            bytes: AtomicU64::new(0),
            losing: AtomicBool::new(false),
            lost: AtomicU64::new(0),
        };
        let shared = Arc::new(Shared {
            behaviour,
            up: AtomicBool::new(true),
            cut: Mutex::new(CancellationToken::new()),
            conns: Mutex::new(Vec::new()),
            to_server: pipe(),
            to_client: pipe(),
        });
        let stop = CancellationToken::new();
        let (s, st) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = st.cancelled() => return,
                };
                let Ok((client, _)) = accepted else { continue };
                if !s.up.load(Ordering::SeqCst) {
                    // A cut link: the connection goes nowhere.
                    drop(client);
                    continue;
                }
                let cut = s
                    .cut
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .child_token();
                {
                    let mut conns = s.conns.lock().unwrap_or_else(|e| e.into_inner());
                    conns.retain(|c| !c.is_cancelled());
                    conns.push(cut.clone());
                }
                let s = s.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let carried = async {
                        match &s.behaviour {
                            Behaviour::Link(link) => {
                                let (cr, cw) = client.into_split();
                                let (sr, sw) = server.into_split();
                                tokio::select! {
                                    _ = pump(cr, sw, link, &s.to_server) => {}
                                    _ = pump(sr, cw, link, &s.to_client) => {}
                                }
                            }
                            Behaviour::Faults(plan) => {
                                faults::carry(
                                    client,
                                    server,
                                    plan.clone(),
                                    &s.to_server,
                                    &s.to_client,
                                )
                                .await
                            }
                        }
                    };
                    tokio::select! {
                        _ = carried => {}
                        _ = cut.cancelled() => {}
                    }
                    // Closed either way: no longer open.
                    cut.cancel();
                });
            }
        });
        Ok(Proxy { port, shared, stop })
    }

    /// A URI for MongoDB through the proxy (options appended as given).
    pub fn mongodb_uri(&self, options: &str) -> String {
        format!(
            "mongodb://127.0.0.1:{}/?directConnection=true{options}",
            self.port
        )
    }

    /// Cuts the link: open connections break, new ones are refused.
    pub fn cut(&self) {
        self.shared.up.store(false, Ordering::SeqCst);
        let token = self.shared.cut.lock().unwrap_or_else(|e| e.into_inner());
        token.cancel();
    }

    /// Breaks the oldest open connection alone and refuses new ones until
    /// [`Proxy::restore`]: the other connections go on. False if none was
    /// open.
    pub fn cut_one(&self) -> bool {
        self.shared.up.store(false, Ordering::SeqCst);
        let conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        match conns.iter().find(|c| !c.is_cancelled()) {
            Some(c) => {
                c.cancel();
                true
            }
            None => false,
        }
    }

    /// Restores the link.
    pub fn restore(&self) {
        *self.shared.cut.lock().unwrap_or_else(|e| e.into_inner()) = CancellationToken::new();
        self.shared.up.store(true, Ordering::SeqCst);
    }

    /// From now on the link loses (`true`) or carries again what the
    /// client sends to the server and what the server sends to the
    /// client; connections stay open.
    pub fn lose(&self, to_server: bool, to_client: bool) {
        self.shared
            .to_server
            .losing
            .store(to_server, Ordering::SeqCst);
        self.shared
            .to_client
            .losing
            .store(to_client, Ordering::SeqCst);
    }

    /// Bytes lost so far (client to server, server to client).
    pub fn lost(&self) -> (u64, u64) {
        (
            self.shared.to_server.lost.load(Ordering::Relaxed),
            self.shared.to_client.lost.load(Ordering::Relaxed),
        )
    }

    /// Bytes carried (client to server, server to client).
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.shared.to_server.bytes.load(Ordering::Relaxed),
            self.shared.to_client.bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut();
    }
}

/// Carries one direction: each chunk arrives when the link would deliver
/// it (in order; chunks in flight are buffered, as a link's queue is).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: &Link,
    pipe: &Pipe,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) if pipe.losing.load(Ordering::SeqCst) => {
                    pipe.lost.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(n) => {
                    let at = pipe.schedule(link, n);
                    if tx.send((at, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
