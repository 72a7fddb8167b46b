//! The HTTP side of a live verify: one [`Client`] per endpoint (a base URL such as
//! `http://host:8000`), JSON GETs and POSTs with a per-request timeout, plain-text GETs for
//! Prometheus pages, and the retry rule: a transport failure or a 5xx / 429 is retried, anything
//! else is an answer. Loopback and plain HTTP or HTTPS (rustls) alike, through `ureq`.

use std::time::Duration;

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
        Ok(Client { base, agent })
    }

    /// The base URL (without a trailing `/` or `/v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The server this base URL reaches, for telling two endpoints apart: scheme, host (the
    /// loopback names `localhost`, `127.0.0.1` and `[::1]` as one), port (the scheme's default
    /// when absent), path.
    pub fn server_key(&self) -> String {
        let (scheme, rest) = self.base.split_once("://").unwrap_or(("http", &self.base));
        let (host_port, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match host_port
            .rsplit_once(':')
            .filter(|_| !host_port.ends_with(']'))
        {
            Some((h, p)) => (h, p.to_string()),
            None => (
                host_port,
                if scheme == "https" { "443" } else { "80" }.into(),
            ),
        };
        let host = host.to_ascii_lowercase();
        let host = match host.as_str() {
            "localhost" | "127.0.0.1" | "[::1]" => "loopback",
            h => h,
        };
        format!("{scheme}://{host}:{port}/{}", path.trim_end_matches('/'))
    }

    /// `base + path` as a string, for messages.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST `body` as JSON to `path`; the response parsed as JSON.
    pub fn post_json(&self, path: &str, body: &Value) -> std::result::Result<Value, Failure> {
        let r = self.agent.post(&self.url(path)).send_json(body.clone());
        json_of(r)
    }

    /// GET `path` as JSON.
    pub fn get_json(&self, path: &str) -> std::result::Result<Value, Failure> {
        json_of(self.agent.get(&self.url(path)).call())
    }

    /// GET `path` as text (a Prometheus page).
    pub fn get_text(&self, path: &str) -> std::result::Result<String, Failure> {
        let r = not_redirected(self.agent.get(&self.url(path)).call().map_err(failure)?)?;
        r.into_string().map_err(|e| Failure {
            retryable: true,
            msg: format!("reading the response failed: {e}"),
        })
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
        let key = |u: &str| Client::new(u, t).unwrap().server_key();
        assert_eq!(
            key("http://localhost:8000/v1/"),
            key("http://127.0.0.1:8000")
        );
        assert_eq!(key("http://[::1]:8000"), key("http://127.0.0.1:8000/"));
        assert_eq!(key("http://h"), key("http://h:80"));
        assert_ne!(key("http://h:8000"), key("http://h:8001"));
        assert_ne!(key("http://h:8000/a"), key("http://h:8000/b"));
        for bad in [
            "h:8000",
            "ftp://h",
            "http://",
            "http://h:0",
            "http://h:99999",
            "http://h:x",
        ] {
            let e = Client::new(bad, t).err().expect(bad);
            assert!(e.hint().is_some(), "{bad}");
        }
    }
}
