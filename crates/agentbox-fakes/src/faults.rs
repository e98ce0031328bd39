//! A fault switch every HTTP fake serves behind: rules a test sets that make requests meet a
//! vendor's bad day (an error status, an answer stalled past the caller's deadline, a
//! connection dropped mid-answer, an answer cut short or not JSON at all), by route, for a
//! count of requests or with a probability drawn from a seeded generator, so a run of faults
//! is the same run again for the same seed.
//!
//! ```
//! use std::time::Duration;
//! use agentbox_fakes::faults::{Fault, Faults, Rule};
//! let faults = Faults::new(7);
//! faults.add(Rule::on("POST", "/api/sandbox", Fault::Status(503)).times(2));
//! faults.add(Rule::on("GET", "/", Fault::Stall(Duration::from_secs(30))).probability(0.1));
//! assert_eq!(faults.injected(), 0);
//! ```

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// What a request that meets a fault gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// This status, with a body that is JSON but no vendor's error shape (429 and 503 with
    /// `Retry-After: 1`).
    Status(u16),
    /// The answer after this long (past the caller's deadline, for a hang).
    Stall(Duration),
    /// The answer's head, then the connection dropped before any of its body.
    Drop,
    /// The real answer, cut after half of its body, the connection then dropped.
    Truncate,
    /// The real answer, its JSON body made invalid (an answer that is not JSON, a file's
    /// bytes, is let through, and the fault waits for the next one).
    Malformed,
}

impl Fault {
    /// Its name in a report.
    pub fn name(&self) -> String {
        match self {
            Fault::Status(s) => s.to_string(),
            Fault::Stall(_) => "stall".into(),
            Fault::Drop => "drop".into(),
            Fault::Truncate => "truncate".into(),
            Fault::Malformed => "malformed".into(),
        }
    }
}

/// When a fault applies: a method (any when `None`), a path prefix, and how often.
#[derive(Clone, Debug)]
pub struct Rule {
    method: Option<String>,
    prefix: String,
    fault: Fault,
    /// Left to inject (`None`: no bound).
    times: Option<usize>,
    /// The chance a matching request meets it (`None`: every one).
    probability: Option<f64>,
}

impl Rule {
    /// Every request of `method` (`"*"`: any) whose path starts with `prefix` meets `fault`.
    pub fn on(method: &str, prefix: &str, fault: Fault) -> Rule {
        Rule {
            method: (method != "*").then(|| method.to_ascii_uppercase()),
            prefix: prefix.to_string(),
            fault,
            times: None,
            probability: None,
        }
    }

    /// Only the next `n` matching requests.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }

    /// Each matching request with chance `p` (0 to 1), drawn from the switch's seed.
    pub fn probability(mut self, p: f64) -> Rule {
        self.probability = Some(p.clamp(0.0, 1.0));
        self
    }
}

/// The rules of one fake, and how many faults they injected.
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    rng: Mutex<u64>,
    injected: AtomicU64,
}

impl Faults {
    /// A switch with no rules, its draws seeded with `seed`.
    pub fn new(seed: u64) -> Arc<Faults> {
        Arc::new(Faults {
            rules: Mutex::new(Vec::new()),
            // xorshift has no zero state.
            rng: Mutex::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            injected: AtomicU64::new(0),
        })
    }

    /// Add a rule; the first rule that applies to a request is the one it meets.
    pub fn add(&self, rule: Rule) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).push(rule);
    }

    /// Remove every rule.
    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// How many requests met a fault so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// The next draw in [0, 1).
    fn draw(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The fault a request meets, if any (counting it), and its rule's place.
    fn pick(&self, method: &str, path: &str) -> Option<(usize, Fault)> {
        let mut rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        for (i, r) in rules.iter_mut().enumerate() {
            if r.times == Some(0) || !path.starts_with(&r.prefix) || r.method.as_deref().is_some_and(|m| m != method) {
                continue;
            }
            if let Some(p) = r.probability
                && self.draw() >= p
            {
                continue;
            }
            if let Some(t) = &mut r.times {
                *t -= 1;
            }
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Some((i, r.fault.clone()));
        }
        None
    }

    /// A fault picked for rule `i` could not be injected after all: not counted.
    fn refund(&self, i: usize) {
        if let Some(r) = self.rules.lock().unwrap_or_else(|p| p.into_inner()).get_mut(i)
            && let Some(t) = &mut r.times
        {
            *t += 1;
        }
        self.injected.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("rules", &self.rules.lock().unwrap_or_else(|p| p.into_inner()).len())
            .field("injected", &self.injected())
            .finish()
    }
}

/// `app` behind the switch, when there is one.
pub(crate) fn wrap(app: axum::Router, faults: Option<&Arc<Faults>>) -> axum::Router {
    match faults {
        Some(f) => app.layer(axum::middleware::from_fn_with_state(f.clone(), layer)),
        None => app,
    }
}

/// A body that ends in an error after `bytes`: hyper drops the connection there.
fn broken_body(bytes: Vec<u8>) -> Body {
    let head = futures_util::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from(bytes))]);
    let cut = futures_util::stream::iter([Err(std::io::Error::other("an injected fault dropped the connection"))]);
    Body::from_stream(head.chain(cut))
}

/// The layer: `axum::middleware::from_fn_with_state(faults, faults::layer)`.
pub async fn layer(State(faults): State<Arc<Faults>>, req: Request, next: Next) -> Response {
    let Some((rule, fault)) = faults.pick(req.method().as_str(), req.uri().path()) else {
        return next.run(req).await;
    };
    tracing::info!(method = %req.method(), path = %req.uri().path(), fault = %fault.name(), "injected a fault");
    let json = |status: StatusCode, body: &str| {
        let mut r = Response::new(Body::from(body.to_string()));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r
    };
    match fault {
        Fault::Status(s) => {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = json(status, r#"{"message":"an injected fault"}"#);
            if s == 429 || s == 503 {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            r
        }
        Fault::Stall(d) => {
            tokio::time::sleep(d).await;
            next.run(req).await
        }
        Fault::Drop => {
            let mut r = json(StatusCode::OK, "");
            *r.body_mut() = broken_body(Vec::new());
            r
        }
        Fault::Truncate => {
            let r = next.run(req).await;
            let (mut parts, body) = r.into_parts();
            // Bounded: a fake's answers are JSON, never a stream past this.
            let whole = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, broken_body(whole[..whole.len() / 2].to_vec()))
        }
        Fault::Malformed => {
            let r = next.run(req).await;
            let is_json = r
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("json"));
            if !is_json {
                faults.refund(rule);
                return r;
            }
            let (mut parts, _) = r.into_parts();
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(r#"{"id": "not-json"#))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_apply_by_route_count_and_a_seeded_chance() {
        let f = Faults::new(1);
        f.add(Rule::on("POST", "/api/a", Fault::Status(500)).times(2));
        assert_eq!(f.pick("GET", "/api/a"), None, "another method");
        assert_eq!(f.pick("POST", "/api/b"), None, "another route");
        assert_eq!(f.pick("POST", "/api/a/x"), Some((0, Fault::Status(500))));
        f.refund(0);
        assert_eq!(f.injected(), 0, "a refunded fault is not counted");
        assert_eq!(f.pick("POST", "/api/a"), Some((0, Fault::Status(500))));
        assert_eq!(f.pick("POST", "/api/a"), Some((0, Fault::Status(500))));
        assert_eq!(f.pick("POST", "/api/a"), None, "two, then none");
        f.clear();
        f.add(Rule::on("*", "/", Fault::Drop).probability(0.5));
        let run = |seed| {
            let f = Faults::new(seed);
            f.add(Rule::on("*", "/", Fault::Drop).probability(0.5));
            (0..200).map(|_| f.pick("GET", "/x").is_some()).collect::<Vec<_>>()
        };
        let a = run(9);
        assert_eq!(a, run(9), "the same seed, the same faults");
        assert_ne!(a, run(10));
        let hits = a.iter().filter(|h| **h).count();
        assert!((60..140).contains(&hits), "{hits} of 200 at 0.5");
    }
}
