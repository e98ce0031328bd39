//! The live views (`/v1/events`, `/v1/boxes/{id}/events`) read as a client reads server-sent
//! events, and a browser's WebSocket showing its key as a subprotocol: each key sees its own
//! boxes alone, a box made or ended shows without waiting for a tick, and a key never comes
//! back in an answer.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentbox_server::{Keys, Limits};
use futures_util::StreamExt;
use serde_json::{Value, json};
use support::*;

/// A view's events as they come: `(event, data)`.
struct Feed {
    body: reqwest::Response,
    buf: String,
}

impl Feed {
    async fn open(s: &Server, key: &str, path: &str) -> Result<Feed, u16> {
        let r = s
            .http
            .get(format!("{}{path}", s.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        if !r.status().is_success() {
            return Err(r.status().as_u16());
        }
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        Ok(Feed {
            body: r,
            buf: String::new(),
        })
    }

    /// The next event, within `within`.
    async fn next(&mut self, within: Duration) -> (String, Value) {
        tokio::time::timeout(within, async {
            loop {
                if let Some(i) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..i + 2).collect();
                    let mut name = String::new();
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(n) = line.strip_prefix("event:") {
                            name = n.trim().to_string();
                        } else if let Some(d) = line.strip_prefix("data:") {
                            data.push_str(d.trim_start());
                        }
                    }
                    if !data.is_empty() {
                        return (name, serde_json::from_str(&data).unwrap());
                    }
                    continue;
                }
                let chunk = self.body.chunk().await.unwrap().expect("the feed goes on");
                self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("an event in time")
    }

    /// Events until one named `name` for which `pick` holds.
    async fn until(&mut self, name: &str, pick: impl Fn(&Value) -> bool) -> Value {
        loop {
            let (n, data) = self.next(Duration::from_secs(20)).await;
            if n == name && pick(&data) {
                return data;
            }
        }
    }
}

/// A local box of `key`'s, for ten minutes: its id.
async fn local_box(s: &Server, key: &str) -> String {
    let (st, made) = call(
        s,
        Some(key),
        "POST",
        "/v1/boxes",
        Some(json!({"provider": "local", "spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{made}");
    made["id"].as_str().unwrap().to_string()
}

fn ids(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| {
                    b.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| b["id"].as_str().unwrap().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_follows_its_own_boxes_live() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, a) = keys.add("a", false, local()).await.unwrap();
    let (_, b) = keys.add("b", false, local()).await.unwrap();
    let (_, admin) = keys.add("root", true, Limits::default()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let s = start_in(keys, 1 << 20, home.path()).await;

    assert_eq!(Feed::open(&s, "abk_wrong", "/v1/events").await.err(), Some(401));
    let mut fa = Feed::open(&s, &a, "/v1/events").await.unwrap();
    let (name, hello) = fa.next(Duration::from_secs(10)).await;
    assert_eq!(
        (name.as_str(), &hello["key"], &hello["admin"]),
        ("hello", &json!("a"), &json!(false))
    );
    let first = fa.until("boxes", |_| true).await;
    assert_eq!(
        (&first["full"], ids(&first, "boxes").len()),
        (&json!(true), 0),
        "{first}"
    );
    let health = fa.until("health", |_| true).await;
    assert!(
        health["providers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "local"),
        "{health}"
    );
    let mut fb = Feed::open(&s, &b, "/v1/events").await.unwrap();
    fb.until("boxes", |_| true).await;

    // Made by a: shown to a at once (the server says a box changed), never to b.
    let id = local_box(&s, &a).await;
    let shown = fa.until("boxes", |d| ids(d, "upsert").contains(&id)).await;
    let row = &shown["upsert"][0];
    assert_eq!(
        (&row["state"], &row["provider"]),
        (&json!("running"), &json!("local")),
        "{shown}"
    );
    assert!(row["facts"]["ends_at_ms"].as_u64().unwrap() > shown["now_ms"].as_u64().unwrap());
    let mut fadmin = Feed::open(&s, &admin, "/v1/events").await.unwrap();
    let all = fadmin.until("boxes", |_| true).await;
    let theirs = all["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == json!(id))
        .cloned();
    assert_eq!(
        theirs.map(|r| r["owner"].clone()),
        Some(json!("a")),
        "an admin sees whose it is: {all}"
    );

    // One box's view: another key's is refused before any event, as a box that is not there.
    let path = format!("/v1/boxes/{id}/events");
    assert_eq!(Feed::open(&s, &b, &path).await.err(), Some(404));
    let mut one = Feed::open(&s, &a, &path).await.unwrap();
    let boxed = one.until("box", |_| true).await;
    assert_eq!(boxed["id"], json!(id));
    one.until("processes", |d| d["processes"].is_array()).await;
    let (st, started) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/processes"),
        Some(json!({"command": "sleep 30"})),
    )
    .await;
    assert_eq!(st, 201, "{started}");
    let listed = one
        .until("processes", |d| !d["processes"].as_array().unwrap().is_empty())
        .await;
    assert_eq!(listed["processes"][0]["handle"], started["handle"]);

    // Ended: gone from a's list and from its view.
    let (st, _) = call(&s, Some(&a), "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204);
    fa.until("boxes", |d| ids(d, "removed").contains(&id)).await;
    one.until("gone", |_| true).await;
    // b saw nothing of it, all along.
    let seen = tokio::time::timeout(
        Duration::from_secs(3),
        fb.until("boxes", |d| ids(d, "upsert").contains(&id)),
    )
    .await;
    assert!(seen.is_err(), "b was shown a's box");
    // Closed by the client, each view ends at its next write.
    drop((fa, fb, fadmin, one));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browsers_socket_shows_its_key_as_a_subprotocol_never_echoed() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, a) = keys.add("a", false, local()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let s = start_in(keys, 1 << 20, home.path()).await;
    let id = &local_box(&s, &a).await;
    let (st, started) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/processes"),
        Some(json!({"command": "echo hi"})),
    )
    .await;
    assert_eq!(st, 201, "{started}");
    let connect = |key: String| {
        let url = format!(
            "{}/v1/boxes/{id}/processes/{}/stream",
            s.url.replace("http://", "ws://"),
            started["handle"]
        );
        let addr = s.url.trim_start_matches("http://").to_string();
        async move {
            let mut req = url.into_client_request().unwrap();
            req.headers_mut().insert(
                "sec-websocket-protocol",
                format!(
                    "{}, {}{key}",
                    agentbox_server::WS_PROTOCOL,
                    agentbox_server::WS_KEY_PREFIX
                )
                .parse()
                .unwrap(),
            );
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio_tungstenite::client_async(req, tcp).await
        }
    };
    let (mut ws, answer) = connect(a.clone()).await.unwrap();
    assert_eq!(answer.headers()["sec-websocket-protocol"], agentbox_server::WS_PROTOCOL);
    assert!(!format!("{:?}", answer.headers()).contains(&a), "the key came back");
    // The first message (a ping may come before it) is the program's output.
    let first = loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if m.is_text() {
            break m.into_text().unwrap().to_string();
        }
    };
    assert!(first.contains("\"output\""), "{first}");
    match connect("abk_wrong".into()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 401),
        other => panic!("a wrong key's socket: {other:?}"),
    }
    s.stop().await;
}
