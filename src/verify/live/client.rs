//! The HTTP side of a live verify: one [`Client`] per endpoint (a base URL such as
//! `http://host:8000`), JSON GETs and POSTs with a per-request timeout, plain-text GETs for
//! Prometheus pages, and the retry rule: a transport failure or a 5xx / 429 is retried, anything
//! else is an answer. Loopback and plain HTTP or HTTPS (rustls) alike, through `ureq`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};

/// A failed call: whether another try could help, and what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub retryable: bool,
    pub msg: String,
}

/// One serving engine's endpoint.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    /// Every call ends by then (the preflight's one `--request-timeout` for all its calls).
    deadline: Option<Instant>,
}

impl Client {
    /// A client of `url` (scheme `http` or `https`, a host, an optional port and path prefix)
    /// whose every call gives up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Client> {
        let bad = |msg: &str| Error::Endpoint {
            url: url.to_string(),
            msg: msg.to_string(),
            hint: Some("give the server's base URL, e.g. --endpoint http://127.0.0.1:8000".into()),
        };
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| bad("is not an http:// or https:// URL"))?;
        let host = rest.split('/').next().unwrap_or("");
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad("has no host"));
        }
        if let Some((_, port)) = host.rsplit_once(':').filter(|_| !host.ends_with(']')) {
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!(
                    "has port `{port}`, not a number in 1..=65535"
                )));
            }
        }
        let base = url.trim_end_matches('/');
        // The engines' OpenAI routes live under `/v1`: a base given with it is the same server.
        let base = base.strip_suffix("/v1").unwrap_or(base).to_string();

        // Redirects are never followed: a 301/302/303 turns a POST into a GET without the
        // prompt or `temperature: 0`, and the server measured would not be the one named.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .redirects(0)
            .build();
        if let Err(e) = agent.get(&base).request_url() {
            return Err(bad(&format!("is not a URL ({e})")));
        }
        Ok(Client {
            base,
            agent,
            deadline: None,
        })
    }

    /// This client with every call ending by `deadline`: a call that would start after it
    /// fails unsent, one that starts before it is cut at it.
    pub fn until(&self, deadline: Instant) -> Client {
        Client {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// A request to `path`, its timeout cut to the deadline.
    fn request(&self, method: &str, path: &str) -> std::result::Result<ureq::Request, Failure> {
        let r = self.agent.request(method, &self.url(path));
        let Some(d) = self.deadline else {
            return Ok(r);
        };
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure {
                retryable: false,
                msg: "not sent: the preflight had already taken --request-timeout".into(),
            });
        }
        Ok(r.timeout(left))
    }

    /// The base URL (without a trailing `/` or `/v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Who answers at this base URL, for telling two endpoints apart: the URL parsed as the
    /// HTTP client parses it (IPv4 shorthands such as `127.1` or `0x7f000001`, a leading-zero
    /// port, userinfo, `/./` normalised away), then its host resolved (docs/verify.md, "Which
    /// servers are the same").
    pub fn server(&self) -> ServerId {
        ServerId::of(&self.agent, &self.base)
    }

    /// `base + path` as a string, for messages.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST `body` as JSON to `path`; the response parsed as JSON.
    pub fn post_json(&self, path: &str, body: &Value) -> std::result::Result<Value, Failure> {
        json_of(self.request("POST", path)?.send_json(body.clone()))
    }

    /// GET `path` as JSON.
    pub fn get_json(&self, path: &str) -> std::result::Result<Value, Failure> {
        json_of(self.request("GET", path)?.call())
    }

    /// GET `path` as text (a Prometheus page).
    pub fn get_text(&self, path: &str) -> std::result::Result<String, Failure> {
        let r = not_redirected(self.request("GET", path)?.call().map_err(failure)?)?;
        r.into_string().map_err(|e| Failure {
            retryable: true,
            msg: format!("reading the response failed: {e}"),
        })
    }
}

/// One address of a server, as two endpoints are compared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Host {
    /// This machine: a loopback address (`127.0.0.0/8`, `::1`), the unspecified one
    /// (`0.0.0.0`, `::`, which a client's connection reaches as loopback), one of its own
    /// interfaces' addresses, or a name that resolves to those alone (`localhost`).
    ThisMachine,
    /// Another machine's address.
    Ip(std::net::IpAddr),
}

/// Who answers at a base URL: the port (the scheme's default when absent), the path prefix
/// (without a trailing `/` or `/v1`), the host's name as written (lower case, no trailing dot)
/// where it is one, and its addresses (an IP literal's own, a name's resolved ones).
#[derive(Debug, Clone)]
pub struct ServerId {
    name: Option<String>,
    hosts: Vec<Host>,
    port: u16,
    path: String,
}

impl ServerId {
    /// The identity of `base` (a URL [`Client::new`] accepted), parsed by `agent`.
    fn of(agent: &ureq::Agent, base: &str) -> ServerId {
        use std::net::{IpAddr, Ipv6Addr, ToSocketAddrs};
        // Parsed by the HTTP client's own URL parser (WHATWG): what it connects to.
        let parsed = agent.get(base).request_url().ok();
        let u = parsed.as_ref().map(|r| r.as_url());
        let port = u.and_then(|u| u.port_or_known_default()).unwrap_or(80);
        let path = u.map_or("", |u| u.path()).trim_end_matches('/');
        let path = path.strip_suffix("/v1").unwrap_or(path);
        let path = path.trim_end_matches('/').to_string();
        let host = u
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        let literal: Option<IpAddr> = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']'))
        {
            Some(v6) => v6
                .parse::<Ipv6Addr>()
                .ok()
                .map(|a| match a.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(a),
                }),
            None => host.parse().ok(),
        };
        let (name, addrs) = match literal {
            Some(ip) => (None, vec![ip]),
            None => {
                let name = host.trim_end_matches('.').to_string();
                // Resolved as the connection would be; a name that does not resolve keeps
                // its name alone.
                let addrs = (name.as_str(), port)
                    .to_socket_addrs()
                    .map(|a| a.map(|s| s.ip()).collect())
                    .unwrap_or_default();
                (Some(name), addrs)
            }
        };
        let mut hosts: Vec<Host> = addrs.into_iter().map(host_of).collect();
        hosts.sort();
        hosts.dedup();
        ServerId {
            name,
            hosts,
            port,
            path,
        }
    }

    /// Whether `self` and `other` reach the same server: the same port and path prefix, and the
    /// same host: the same name, or both this machine, or an IP literal that the other's name
    /// resolves to. Two names of other machines that resolve to one address are two servers
    /// (virtual hosts behind one proxy); the scheme is no part of it (one port serves one).
    pub fn same_as(&self, other: &ServerId) -> bool {
        if self.port != other.port || self.path != other.path {
            return false;
        }
        if self.name.is_some() && self.name == other.name {
            return true;
        }
        let local =
            |s: &ServerId| !s.hosts.is_empty() && s.hosts.iter().all(|h| *h == Host::ThisMachine);
        if local(self) && local(other) {
            return true;
        }
        match (&self.name, &other.name) {
            (Some(_), Some(_)) => false,
            _ => self.hosts.iter().any(|h| other.hosts.contains(h)),
        }
    }
}

/// An address as [`ServerId`] compares it: IPv4-mapped IPv6 as IPv4, this machine's as one.
fn host_of(ip: std::net::IpAddr) -> Host {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    // An address this machine can bind is one of its own interfaces'.
    if ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok() {
        Host::ThisMachine
    } else {
        Host::Ip(ip)
    }
}

fn failure(e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Status(code, r) => {
            let body = r.into_string().unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            Failure {
                retryable: code >= 500 || code == 429,
                msg: format!("HTTP {code}: {}", body.trim()),
            }
        }
        ureq::Error::Transport(t) => {
            // A read that timed out surfaces as the socket's EAGAIN ("Resource temporarily
            // unavailable"), through TLS too: say what it is.
            let timed_out = std::error::Error::source(&t)
                .and_then(|e| e.downcast_ref::<std::io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                });
            Failure {
                retryable: true,
                msg: if timed_out {
                    format!("timed out: no answer within --request-timeout ({t})")
                } else {
                    t.to_string()
                },
            }
        }
    }
}

/// A 3xx answer is a failure that names where it points: kquant measures the server named.
fn not_redirected(r: ureq::Response) -> std::result::Result<ureq::Response, Failure> {
    if (300..400).contains(&r.status()) {
        let to = r
            .header("location")
            .map(crate::escape::printable)
            .unwrap_or_else(|| "nowhere (no Location header)".into());
        return Err(Failure {
            retryable: false,
            msg: format!(
                "HTTP {} redirects to {to}: kquant does not follow redirects (a POST would reach another server, or lose its body); give the final URL",
                r.status()
            ),
        });
    }
    Ok(r)
}

fn json_of(
    r: std::result::Result<ureq::Response, ureq::Error>,
) -> std::result::Result<Value, Failure> {
    let text = not_redirected(r.map_err(failure)?)?
        .into_string()
        .map_err(|e| Failure {
            retryable: true,
            msg: format!("reading the response failed: {e}"),
        })?;
    serde_json::from_str(&text).map_err(|e| Failure {
        retryable: false,
        msg: format!(
            "the response is not JSON ({e}): {}",
            text.chars().take(200).collect::<String>()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_normalised() {
        let t = Duration::from_secs(1);
        assert_eq!(
            Client::new("http://h:8000/", t).unwrap().base(),
            "http://h:8000"
        );
        assert_eq!(
            Client::new("http://h:8000/v1", t).unwrap().base(),
            "http://h:8000"
        );
        assert_eq!(Client::new("https://h/x", t).unwrap().base(), "https://h/x");
        let same = |a: &str, b: &str| {
            let (a, b) = (Client::new(a, t).unwrap(), Client::new(b, t).unwrap());
            a.server().same_as(&b.server())
        };
        assert!(same("http://localhost:8000/v1/", "http://127.0.0.1:8000"));
        assert!(same("http://[::1]:8000", "http://127.0.0.1:8000/"));
        assert!(same("http://127.1:8000", "http://0x7f000001:08000/./"));
        assert!(same(
            "http://u:p@10.1.2.3:8000",
            "http://[::ffff:10.1.2.3]:8000"
        ));
        assert!(same("http://h.invalid", "http://H.invalid.:80"));
        assert!(!same("http://10.1.2.3:8000", "http://10.1.2.4:8000"));
        assert!(!same("http://a.invalid:8000", "http://b.invalid:8000"));
        assert!(!same("http://h.invalid:8000", "http://h.invalid:8001"));
        assert!(!same("http://h.invalid:8000/a", "http://h.invalid:8000/b"));
        for bad in [
            "h:8000",
            "ftp://h",
            "http://",
            "http://h:0",
            "http://h:99999",
            "http://h:x",
            "http://[::1",
        ] {
            let e = Client::new(bad, t).err().expect(bad);
            assert!(e.hint().is_some(), "{bad}");
        }
    }
}
