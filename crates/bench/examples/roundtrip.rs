//! This machine's round-trip ceiling: a server that does no work (reads a 120-byte request,
//! answers 1,250 bytes, the size of a YCSB read reply) and a client shaped like
//! `shoal bench`'s (tokio, N tasks, one request in flight each). What it reaches bounds what
//! any database can do with the same client here.
//!
//! cargo run --release -p shoal-bench --example roundtrip -- server &
//! cargo run --release -p shoal-bench --example roundtrip -- client 8 10   # tasks, seconds
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REQ: usize = 120;
const REPLY: usize = 1250;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str).unwrap_or("") {
        "server" => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let l = TcpListener::bind("127.0.0.1:29999").await.unwrap();
                loop {
                    let (mut s, _) = l.accept().await.unwrap();
                    s.set_nodelay(true).unwrap();
                    tokio::spawn(async move {
                        let mut req = [0u8; REQ];
                        let reply = vec![7u8; REPLY];
                        loop {
                            if s.read_exact(&mut req).await.is_err() {
                                return;
                            }
                            if s.write_all(&reply).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        }
        "client" => {
            let tasks: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
            let secs: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10);
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            let n = Arc::new(AtomicU64::new(0));
            rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(secs);
                let mut hs = vec![];
                for _ in 0..tasks {
                    let n = n.clone();
                    hs.push(tokio::spawn(async move {
                        let mut s = TcpStream::connect("127.0.0.1:29999").await.unwrap();
                        s.set_nodelay(true).unwrap();
                        let req = [1u8; REQ];
                        let mut reply = vec![0u8; REPLY];
                        while Instant::now() < deadline {
                            s.write_all(&req).await.unwrap();
                            s.read_exact(&mut reply).await.unwrap();
                            n.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                for h in hs {
                    h.await.unwrap();
                }
            });
            println!("{} tasks: {:.0} ops/s", tasks, n.load(Ordering::Relaxed) as f64 / secs as f64);
        }
        _ => eprintln!("usage: roundtrip server | roundtrip client [TASKS] [SECONDS]"),
    }
}
