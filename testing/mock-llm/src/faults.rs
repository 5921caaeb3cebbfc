//! Fault injection: a share of chat requests is answered with a failure instead of the reply.
//!
//! A [`FaultPlan`] gives a rate per fault class; the class of each chat request is drawn from
//! a generator seeded with [`FaultPlan::seed`] and the request's arrival number, so a plan and a
//! sequence of arrivals always give the same faults. The classes:
//!
//! | class | what the client sees |
//! |---|---|
//! | `rate_limited` | HTTP 429 `rate_limit_exceeded`, no `Retry-After` |
//! | `rate_limited_retry_after` | HTTP 429 with `Retry-After` ([`FaultPlan::retry_after`]) |
//! | `server_error` | HTTP 500 |
//! | `unavailable` | HTTP 503 |
//! | `dropped` | the connection closes without a complete response |
//! | `stalled` | status and headers, the first bytes of the body, then nothing until [`FaultPlan::stall_for`] has passed and the connection closes |
//! | `truncated` | HTTP 200 whose JSON body is cut in half |
//!
//! The server counts every fault it injects ([`crate::MockServer::faults_injected`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

/// One kind of injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    RateLimited,
    RateLimitedRetryAfter,
    ServerError,
    Unavailable,
    Dropped,
    Stalled,
    Truncated,
}

impl Fault {
    /// Every class, in the order of [`FaultPlan`]'s rates.
    pub const ALL: [Fault; 7] = [
        Fault::RateLimited,
        Fault::RateLimitedRetryAfter,
        Fault::ServerError,
        Fault::Unavailable,
        Fault::Dropped,
        Fault::Stalled,
        Fault::Truncated,
    ];

    /// A short stable name (`rate_limited`, `dropped`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Fault::RateLimited => "rate_limited",
            Fault::RateLimitedRetryAfter => "rate_limited_retry_after",
            Fault::ServerError => "server_error",
            Fault::Unavailable => "unavailable",
            Fault::Dropped => "dropped",
            Fault::Stalled => "stalled",
            Fault::Truncated => "truncated",
        }
    }

    fn index(self) -> usize {
        Fault::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }
}

/// Rates (each in `[0, 1]`, summing to at most 1) of the faults injected into chat requests.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    pub rate_429: f64,
    pub rate_429_retry_after: f64,
    pub rate_500: f64,
    pub rate_503: f64,
    pub rate_drop: f64,
    pub rate_stall: f64,
    pub rate_truncated: f64,
    /// Seeds the draw; the same seed and arrival order give the same faults.
    pub seed: u64,
    /// The wait a `Retry-After` 429 asks for (sent in whole seconds when it is whole, else
    /// as `retry-after-ms`).
    pub retry_after: Duration,
    /// How long a stalled response hangs before its connection closes.
    pub stall_for: Duration,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self {
            rate_429: 0.0,
            rate_429_retry_after: 0.0,
            rate_500: 0.0,
            rate_503: 0.0,
            rate_drop: 0.0,
            rate_stall: 0.0,
            rate_truncated: 0.0,
            seed: 0,
            retry_after: Duration::from_secs(1),
            stall_for: Duration::from_secs(30),
        }
    }
}

impl FaultPlan {
    /// `total` spread evenly over the seven classes.
    pub fn uniform(total: f64, seed: u64) -> Self {
        let each = total / Fault::ALL.len() as f64;
        Self {
            rate_429: each,
            rate_429_retry_after: each,
            rate_500: each,
            rate_503: each,
            rate_drop: each,
            rate_stall: each,
            rate_truncated: each,
            seed,
            ..Self::default()
        }
    }

    fn rates(&self) -> [f64; 7] {
        [
            self.rate_429,
            self.rate_429_retry_after,
            self.rate_500,
            self.rate_503,
            self.rate_drop,
            self.rate_stall,
            self.rate_truncated,
        ]
    }

    /// The fault for the request that arrived `seq`-th (from 0), if any.
    pub fn draw(&self, seq: u64) -> Option<Fault> {
        let unit = unit(splitmix(self.seed ^ splitmix(seq.wrapping_add(1))));
        let mut edge = 0.0;
        for (fault, rate) in Fault::ALL.iter().zip(self.rates()) {
            edge += rate.max(0.0);
            if unit < edge {
                return Some(*fault);
            }
        }
        None
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Faults injected so far, per class.
#[derive(Debug, Default)]
pub(crate) struct FaultCounts([AtomicU64; 7]);

impl FaultCounts {
    pub(crate) fn add(&self, fault: Fault) {
        self.0[fault.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<Fault, u64> {
        Fault::ALL
            .iter()
            .map(|f| (*f, self.0[f.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

/// The response that carries `fault`; `success` is the JSON body the request would have had.
pub(crate) fn respond(fault: Fault, plan: &FaultPlan, success: &str) -> Response {
    let json = |code: StatusCode, body: &str| {
        let mut response = Response::new(Body::from(body.to_owned()));
        *response.status_mut() = code;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    };
    match fault {
        Fault::RateLimited => json(
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"error":{"message":"Rate limit reached (injected)","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        Fault::RateLimitedRetryAfter => {
            let mut response = json(
                StatusCode::TOO_MANY_REQUESTS,
                r#"{"error":{"message":"Rate limit reached (injected), retry later","type":"requests","code":"rate_limit_exceeded"}}"#,
            );
            let wait = plan.retry_after;
            let (name, value) = if wait.subsec_nanos() == 0 {
                ("retry-after", wait.as_secs().to_string())
            } else {
                ("retry-after-ms", wait.as_millis().to_string())
            };
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, value);
            }
            response
        }
        Fault::ServerError => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"error":{"message":"The server had an error (injected)","type":"server_error"}}"#,
        ),
        Fault::Unavailable => json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"message":"Service unavailable (injected)","type":"server_error"}}"#,
        ),
        Fault::Truncated => {
            let cut = success.len() / 2;
            let cut = (0..=cut)
                .rev()
                .find(|i| success.is_char_boundary(*i))
                .unwrap_or(0);
            json(StatusCode::OK, &success[..cut])
        }
        Fault::Dropped => broken(StatusCode::OK, Bytes::new(), Duration::ZERO),
        Fault::Stalled => {
            let cut = success.len().min(16);
            let head = Bytes::copy_from_slice(&success.as_bytes()[..cut]);
            broken(StatusCode::OK, head, plan.stall_for)
        }
    }
}

/// A response whose body sends `head`, waits `stall`, then fails, so the connection closes
/// without a complete answer.
fn broken(code: StatusCode, head: Bytes, stall: Duration) -> Response {
    let body = BrokenBody {
        head: (!head.is_empty()).then_some(head),
        stall: (!stall.is_zero()).then(|| Box::pin(tokio::time::sleep(stall))),
    };
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

struct BrokenBody {
    head: Option<Bytes>,
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl HttpBody for BrokenBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(head))));
        }
        if let Some(stall) = self.stall.as_mut() {
            if stall.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.stall = None;
        }
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "summon-mock-llm: injected connection failure",
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_near_their_rates() {
        let plan = FaultPlan::uniform(0.2, 7);
        let draws: Vec<_> = (0..20_000).map(|s| plan.draw(s)).collect();
        assert_eq!(draws, (0..20_000).map(|s| plan.draw(s)).collect::<Vec<_>>());
        let faults = draws.iter().filter(|d| d.is_some()).count();
        assert!((3_600..4_400).contains(&faults), "{faults}");
        for fault in Fault::ALL {
            let n = draws.iter().filter(|d| **d == Some(fault)).count();
            assert!((400..750).contains(&n), "{fault:?}: {n}");
        }
        let other = FaultPlan::uniform(0.2, 8);
        assert_ne!(
            draws,
            (0..20_000).map(|s| other.draw(s)).collect::<Vec<_>>()
        );
        assert_eq!(FaultPlan::default().draw(3), None);
    }
}
