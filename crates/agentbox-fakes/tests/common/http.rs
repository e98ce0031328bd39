//! One HTTP/1.1 request to a fake over plain TCP, through hyper's client: the tests judge the
//! fake's answers (status, headers, body), so the client is a well-kept one, not ours.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// A fake's answer, its body read whole.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `method path` to the fake at `addr` with `headers` and `body` on a connection of its own,
/// answered and read to its end within `within`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    within: Duration,
) -> Answer {
    send(addr, method, path, headers, Full::new(Bytes::from(body)), within).await
}

async fn send<B>(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: B,
    within: Duration,
) -> Answer
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let asked = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("the fake listens");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("an HTTP/1.1 connection");
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(body).expect("a well-formed request");
        let resp = sender.send_request(req).await.expect("the fake answers");
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("the body, whole")
            .to_bytes()
            .to_vec();
        Answer { status, headers, body }
    };
    tokio::time::timeout(within, asked)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: the fake did not answer within {within:?}"))
}

/// `method path` whose headers declare a body (`content-length`) that never comes: how a
/// client meets a server that refuses a body from its headers alone, before reading it.
pub async fn request_never_sending_its_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    within: Duration,
) -> Answer {
    let never = futures_util::stream::pending::<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>();
    send(
        addr,
        method,
        path,
        headers,
        http_body_util::StreamBody::new(never),
        within,
    )
    .await
}
