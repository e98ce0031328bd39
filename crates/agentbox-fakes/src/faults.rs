//! A fault switch every fake serves behind: rules a test sets that make requests meet a
//! vendor's bad day (an error status, an answer stalled past the caller's deadline or stalled
//! mid-stream, a connection dropped mid-answer, an answer cut short, an answer that is not
//! JSON or not protobuf), by route, for a count of requests or with a probability drawn from
//! a seeded generator, so a run of faults is the same run again for the same seed.
//!
//! It is a tower layer ([`FaultLayer`]), so the REST fakes (Daytona, E2B, Archil, Kubernetes:
//! axum routers) and the gRPC one (Modal: a tonic server, a route being `/package.Service/
//! Method`) stand behind the same switch, and a fault is the same bytes on the wire whichever
//! client meets it.
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

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use futures_util::StreamExt;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, StreamBody};

/// What a request that meets a fault gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// This status, with a body that is JSON but no vendor's error shape (429 and 503 with
    /// `Retry-After: 1`).
    Status(u16),
    /// The answer after this long (past the caller's deadline, for a hang).
    Stall(Duration),
    /// The answer's head and first piece of its body, then nothing for this long, then the
    /// rest: a stream stalled mid-way.
    StallBody(Duration),
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
            Fault::StallBody(_) => "stall mid-body".into(),
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
        Some(f) => app.layer(FaultLayer::new(Some(f.clone()))),
        None => app,
    }
}

/// What the layer errs with inside a body it breaks.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every answer that passes the layer, its body boxed (a fault may swap it for another).
pub type Answer = http::Response<UnsyncBoxBody<Bytes, BoxError>>;

/// The switch as a tower layer, so any HTTP server can stand behind it: an axum router
/// (`Router::layer`) or a tonic server (`Server::builder().layer`). With no switch it passes
/// every request through.
#[derive(Clone, Debug)]
pub struct FaultLayer(Option<Arc<Faults>>);

impl FaultLayer {
    /// The layer over `faults` (`None`: a pass-through).
    pub fn new(faults: Option<Arc<Faults>>) -> FaultLayer {
        FaultLayer(faults)
    }
}

impl<S> tower_layer::Layer<S> for FaultLayer {
    type Service = FaultService<S>;
    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            faults: self.0.clone(),
        }
    }
}

/// A service behind the switch (see [`FaultLayer`]).
#[derive(Clone, Debug)]
pub struct FaultService<S> {
    inner: S,
    faults: Option<Arc<Faults>>,
}

impl<S, B, RB> tower_service::Service<http::Request<B>> for FaultService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Answer;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The service polled ready is the one called; its clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let picked = self
            .faults
            .as_ref()
            .and_then(|f| Some((f.clone(), f.pick(req.method().as_str(), req.uri().path())?)));
        Box::pin(async move {
            let Some((faults, (rule, fault))) = picked else {
                return Ok(inner.call(req).await?.map(boxed));
            };
            let grpc = is_grpc(req.headers());
            tracing::info!(method = %req.method(), path = %req.uri().path(), fault = %fault.name(), "injected a fault");
            let answer = match fault {
                Fault::Status(s) => {
                    let status = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    let mut r = head(status, "application/json", full(r#"{"message":"an injected fault"}"#));
                    if s == 429 || s == 503 {
                        r.headers_mut()
                            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                    }
                    r
                }
                Fault::Stall(d) => {
                    tokio::time::sleep(d).await;
                    inner.call(req).await?.map(boxed)
                }
                Fault::StallBody(d) => {
                    let r = inner.call(req).await?;
                    let (mut parts, body) = r.into_parts();
                    parts.headers.remove(header::CONTENT_LENGTH);
                    http::Response::from_parts(parts, stalled(body, d))
                }
                Fault::Drop => {
                    let kind = if grpc { "application/grpc" } else { "application/json" };
                    head(StatusCode::OK, kind, broken(futures_util::stream::empty()))
                }
                Fault::Truncate => {
                    let r = inner.call(req).await?;
                    let (mut parts, body) = r.into_parts();
                    parts.headers.remove(header::CONTENT_LENGTH);
                    http::Response::from_parts(parts, truncated(body))
                }
                Fault::Malformed => {
                    let r = inner.call(req).await?;
                    if is_grpc(r.headers()) {
                        let (mut parts, _) = r.into_parts();
                        parts.headers.remove(header::CONTENT_LENGTH);
                        http::Response::from_parts(parts, bad_protobuf())
                    } else if is_json(r.headers()) {
                        let (mut parts, _) = r.into_parts();
                        parts.headers.remove(header::CONTENT_LENGTH);
                        http::Response::from_parts(parts, full(r#"{"id": "not-json"#))
                    } else {
                        // A file's bytes, say: no client could tell them from good ones.
                        faults.refund(rule);
                        r.map(boxed)
                    }
                }
            };
            Ok(answer)
        })
    }
}

fn boxed<RB>(body: RB) -> UnsyncBoxBody<Bytes, BoxError>
where
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

fn full(text: &'static str) -> UnsyncBoxBody<Bytes, BoxError> {
    boxed(http_body_util::Full::new(Bytes::from_static(text.as_bytes())))
}

fn head(status: StatusCode, kind: &'static str, body: UnsyncBoxBody<Bytes, BoxError>) -> Answer {
    let mut r = http::Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r
}

fn content_type(h: &http::HeaderMap) -> &str {
    h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn is_grpc(h: &http::HeaderMap) -> bool {
    content_type(h).starts_with("application/grpc")
}

fn is_json(h: &http::HeaderMap) -> bool {
    content_type(h).contains("json")
}

/// `frames`, then an error: hyper drops the connection (or resets the HTTP/2 stream) there.
fn broken(
    frames: impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
) -> UnsyncBoxBody<Bytes, BoxError> {
    let cut = futures_util::stream::once(async {
        Err::<Frame<Bytes>, BoxError>("an injected fault dropped the connection".into())
    });
    StreamBody::new(frames.chain(cut)).boxed_unsync()
}

/// The answer's first piece of data cut in half, then the connection dropped: a JSON answer
/// (one piece) ends mid-document, a stream or a gRPC message mid-message.
fn truncated<RB>(body: RB) -> UnsyncBoxBody<Bytes, BoxError>
where
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let frames = BodyStream::new(boxed(body));
    let head = futures_util::stream::unfold(Some(frames), |frames| async move {
        let mut frames = frames?;
        match frames.next().await? {
            Err(e) => Some((Err(e), None)),
            Ok(f) => match f.into_data() {
                Ok(data) => Some((Ok(Frame::data(data.slice(..data.len() / 2))), None)),
                // Trailers before any data: nothing to cut, so cut there.
                Err(_) => None,
            },
        }
    });
    broken(head)
}

/// The answer's first piece of data, then nothing for `d`, then the rest: a stream that
/// stalls mid-way, past a caller's silence limit.
fn stalled<RB>(body: RB, d: Duration) -> UnsyncBoxBody<Bytes, BoxError>
where
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    // (the frames, a stall due before the next, a stall done)
    let frames = (BodyStream::new(boxed(body)), false, false);
    let body = futures_util::stream::unfold(frames, move |(mut frames, due, done)| async move {
        if due {
            tokio::time::sleep(d).await;
        }
        let f = frames.next().await?;
        let first_data = !done && f.as_ref().is_ok_and(|f| f.is_data());
        Some((f, (frames, first_data, done || first_data)))
    });
    StreamBody::new(body).boxed_unsync()
}

/// A gRPC answer whose one message is not protobuf (a length-delimited field that claims more
/// bytes than follow), its status OK: the client's decoder must refuse it.
fn bad_protobuf() -> UnsyncBoxBody<Bytes, BoxError> {
    let message = [0x0a, 0x05, 0x01];
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", header::HeaderValue::from_static("0"));
    let frames = futures_util::stream::iter([
        Ok::<_, BoxError>(Frame::data(Bytes::from(frame))),
        Ok(Frame::trailers(trailers)),
    ]);
    StreamBody::new(frames).boxed_unsync()
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

    /// The answer `/x` gives (`kind` its content type, `body` its body) behind one `fault`:
    /// its status, its content type, the pieces of its body and how its body ended.
    async fn through(
        fault: Fault,
        kind: &'static str,
        body: &'static str,
    ) -> (u16, String, Vec<Bytes>, Option<String>) {
        use tower_layer::Layer;
        use tower_service::Service;
        let app: axum::Router = axum::Router::new().route(
            "/x",
            axum::routing::get(move || async move { ([(header::CONTENT_TYPE, kind)], body) }),
        );
        let faults = Faults::new(1);
        faults.add(Rule::on("GET", "/x", fault).times(1));
        let mut svc = FaultLayer::new(Some(faults.clone())).layer(app);
        futures_util::future::poll_fn(|cx| Service::<http::Request<axum::body::Body>>::poll_ready(&mut svc, cx))
            .await
            .unwrap();
        let req = http::Request::get("/x").body(axum::body::Body::empty()).unwrap();
        let r = svc.call(req).await.unwrap();
        assert_eq!(faults.injected(), 1);
        let status = r.status().as_u16();
        let kind = content_type(r.headers()).to_string();
        let mut body = r.into_body();
        let (mut pieces, mut end) = (Vec::new(), None);
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => match f.into_data() {
                    Ok(d) => pieces.push(d),
                    Err(f) => end = Some(format!("trailers {:?}", f.into_trailers().ok())),
                },
                Err(e) => {
                    end = Some(format!("error {e}"));
                    break;
                }
            }
        }
        (status, kind, pieces, end)
    }

    #[tokio::test]
    async fn faults_break_answers_as_they_say() {
        let json = r#"{"id":"0123456789"}"#;
        let (status, _, _, _) = through(Fault::Status(503), "application/json", json).await;
        assert_eq!(status, 503);

        let (status, _, pieces, end) = through(Fault::Drop, "application/json", json).await;
        assert_eq!((status, pieces.len()), (200, 0), "a head and no body");
        assert!(end.unwrap().starts_with("error"));

        let (_, _, pieces, end) = through(Fault::Truncate, "application/json", json).await;
        assert_eq!(pieces.concat(), json.as_bytes()[..json.len() / 2], "half the answer");
        assert!(end.unwrap().starts_with("error"), "then the connection dropped");

        let (_, _, pieces, end) = through(Fault::Malformed, "application/json", json).await;
        assert!(serde_json::from_slice::<serde_json::Value>(&pieces.concat()).is_err());
        assert_eq!(end, None);

        let (_, kind, pieces, end) = through(Fault::Malformed, "application/grpc", "\0\0\0\0\0").await;
        assert_eq!(kind, "application/grpc");
        let frame = pieces.concat();
        assert_eq!(frame[0], 0, "an uncompressed message");
        assert_eq!(
            u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize,
            frame.len() - 5
        );
        assert!(end.unwrap().contains("grpc-status"), "an OK status after it");

        let start = std::time::Instant::now();
        let d = Duration::from_millis(300);
        let (_, _, pieces, end) = through(Fault::StallBody(d), "application/json", json).await;
        assert_eq!(pieces.concat(), json.as_bytes(), "the whole answer, late");
        assert!(start.elapsed() >= d, "it was held for the stall");
        assert_eq!(end, None);
    }
}
