//! The Prometheus text exposition the engines serve on `/metrics` (vLLM; SGLang with
//! `--enable-metrics`), parsed by `prom_text_format_parser` (names with colons such as
//! `vllm:spec_decode_num_drafts_total`, escaped label values, `NaN` / `+Inf`, timestamps), and
//! the one thing a live verify reads from it: a counter family's total over every label set
//! (vLLM labels each data-parallel engine; `vllm bench serve` sums them).

use prom_text_format_parser::{Scrape, Type, ValueType};

use super::client::{Client, Failure};
use super::engine::Counters;

/// A parsed page.
pub struct Page {
    scrape: Scrape,
}

/// Parse a page; the parser's message when it is not the text exposition format.
pub fn parse(text: &str) -> Result<Page, String> {
    let scrape = Scrape::parse(text).map_err(|e| {
        let s = format!("{e:?}");
        s.chars().take(300).collect::<String>()
    })?;
    Ok(Page { scrape })
}

/// GET `/metrics` from `c` and parse it.
pub fn scrape(c: &Client) -> Result<Page, Failure> {
    let text = c.get_text("/metrics")?;
    parse(&text).map_err(|msg| Failure {
        retryable: false,
        msg: format!("/metrics is not a Prometheus page: {msg}"),
    })
}

/// The server-wide counters on `c`'s `/metrics`: the verify steps (counter `steps`) and the
/// accepted drafts `accepted` makes of them and counter `drafts` (`None` when either counter is
/// missing), with the finished requests (counter `requests`) where the page has them.
pub fn counters(
    c: &Client,
    [steps, drafts, requests]: [&str; 3],
    accepted: fn(u64, u64) -> u64,
) -> Result<Option<Counters>, Failure> {
    let m = scrape(c)?;
    let (Some(steps), Some(drafts)) = (m.counter(steps), m.counter(drafts)) else {
        return Ok(None);
    };
    Ok(Some(Counters {
        steps,
        accepted: accepted(steps, drafts),
        requests: m.counter(requests),
    }))
}

impl Page {
    /// The sum over every label set of counter `name` (exposed as `name_total`, as
    /// prometheus_client writes it, or `name`); `None` when the page has no such counter, or a
    /// value that is not a whole non-negative number.
    pub fn counter(&self, name: &str) -> Option<u64> {
        let total = format!("{name}_total");
        let m = self
            .scrape
            .metrics
            .iter()
            .find(|m| (m.name == total || m.name == name) && m.kind != Type::Gauge)?;
        let mut sum = 0u64;
        for s in &m.samples {
            if s.value.value_type != ValueType::Sample {
                continue;
            }
            let v: f64 = s.value.value.parse().ok()?;
            if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 9.0e15) {
                return None;
            }
            sum += v as u64;
        }
        Some(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page as vLLM 0.33.0 serves it (prometheus_client: `_total` counters with their
    /// `_created` gauges, two data-parallel engines), with the line PR vllm-project/vllm#35966
    /// quotes from a Kimi-K2.5 EAGLE-3 server.
    const VLLM: &str = r#"# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="moonshotai/kimi-k2.5"} 42668.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="moonshotai/kimi-k2.5"} 10.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="moonshotai/kimi-k2.5"} 1.7642e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a \"quoted\" name"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 4.0
"#;

    #[test]
    fn counters_are_summed_over_engines_and_labels() {
        let p = parse(VLLM).unwrap();
        assert_eq!(p.counter("vllm:spec_decode_num_drafts"), Some(42678));
        assert_eq!(p.counter("vllm:request_success"), Some(7));
        assert_eq!(p.counter("vllm:num_requests_running"), None, "a gauge");
        assert_eq!(p.counter("vllm:spec_decode_num_accepted_tokens"), None);
        assert!(parse("<html>not metrics</html>").is_err());
        let neg = VLLM.replace("42668.0", "-1");
        assert_eq!(
            parse(&neg).unwrap().counter("vllm:spec_decode_num_drafts"),
            None
        );
    }
}
