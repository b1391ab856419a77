//! A TCP proxy in front of the database that can cut a command on its
//! way (a reply lost after the server applied it).

/// A TCP proxy in front of the database that can cut one connection right
/// after the server answered a write (a bucket write, `$push`, unless told
/// otherwise), dropping the reply:
/// the write is applied but the client never learns it (an ambiguous write).
pub struct CutProxy {
    pub port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CutProxy {
    pub async fn start(upstream: u16) -> CutProxy {
        Self::start_cutting(upstream, b"$push").await
    }

    /// Cuts after the first write whose request contains `marker`.
    pub async fn start_cutting(upstream: u16, marker: &'static [u8]) -> CutProxy {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (a, c) = (a.clone(), c.clone());
                tokio::spawn(async move {
                    if let Ok(server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    {
                        proxy_connection(client, server, a, c, marker).await;
                    }
                });
            }
        });
        CutProxy { port, armed, cuts }
    }

    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }
}

async fn read_frame(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let n = i32::from_le_bytes(len).max(4) as usize;
    let mut frame = len.to_vec();
    frame.resize(n, 0);
    r.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

async fn proxy_connection(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    marker: &'static [u8],
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::AsyncWriteExt;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let cut_reply = std::sync::Arc::new(AtomicBool::new(false));
    let cut = cut_reply.clone();
    let upstream = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            let is_write = frame.windows(marker.len()).any(|w| w == marker);
            if is_write && armed.swap(false, Ordering::SeqCst) {
                cut.store(true, Ordering::SeqCst);
            }
            if sw.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    while let Some(frame) = read_frame(&mut sr).await {
        if cut_reply.load(Ordering::SeqCst) {
            // The server applied the write; its reply never arrives.
            cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if cw.write_all(&frame).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
