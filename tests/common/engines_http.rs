//! A loopback HTTP/1.1 server for the live-verify tests: binds `127.0.0.1:0`, answers each
//! request with what a handler returns (`None` drops the connection unanswered, as a server that
//! died mid-request), one response per connection (`Connection: close`). The engines' own
//! responses are built by the tests (tests/live_endpoint.rs) from their sources' schemas.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One request as the handler sees it.
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

impl Request {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// What to send back.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// A `Location` header (redirects).
    pub location: Option<String>,
}

impl Response {
    pub fn json(v: &serde_json::Value) -> Option<Response> {
        Some(Response {
            status: 200,
            content_type: "application/json",
            body: v.to_string(),
            location: None,
        })
    }
    pub fn text(s: &str) -> Option<Response> {
        Some(Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: s.to_string(),
            location: None,
        })
    }
    pub fn status(code: u16, body: &str) -> Option<Response> {
        Some(Response {
            status: code,
            content_type: "application/json",
            body: body.to_string(),
            location: None,
        })
    }
}

type Handler = dyn Fn(&Request) -> Option<Response> + Send + Sync;

/// A running server; stops when dropped.
pub struct Server {
    pub url: String,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

pub fn serve(handler: impl Fn(&Request) -> Option<Response> + Send + Sync + 'static) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let h: Arc<Handler> = Arc::new(handler);
    let s = stop.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            if s.load(Ordering::SeqCst) {
                return;
            }
            let Ok(conn) = conn else { continue };
            let h = h.clone();
            std::thread::spawn(move || answer(conn, h.as_ref()));
        }
    });
    Server {
        url: format!("http://{addr}"),
        stop,
        addr,
    }
}

fn answer(conn: TcpStream, h: &Handler) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; len];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let Some(resp) = h(&Request { method, path, body }) else {
        return;
    };
    let reason = match resp.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut w = conn;
    let location = resp
        .location
        .as_ref()
        .map(|l| format!("location: {l}\r\n"))
        .unwrap_or_default();
    let _ = write!(
        w,
        "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\n{location}connection: close\r\n\r\n{}",
        resp.status,
        resp.content_type,
        resp.body.len(),
        resp.body
    );
    let _ = w.flush();
}
