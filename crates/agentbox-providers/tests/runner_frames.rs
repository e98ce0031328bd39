//! What a runner sends is not trusted: a malformed frame from it is logged (with what was
//! wrong) and dropped, and the connection goes on serving the calls around it.

use std::sync::{Arc, Mutex};

use agentbox_core::{Ctx, Files};
use agentbox_protocol::runner::{Answer, Message, Request};
use agentbox_providers::runner::{Client, Dial, Link};
use async_trait::async_trait;
use tokio::sync::mpsc;

/// A "runner" scripted in the test: it answers hello, sends two malformed frames, then
/// answers every stat as a file.
struct Scripted;

#[async_trait]
impl Dial for Scripted {
    async fn dial(&self, _ctx: &Ctx) -> agentbox_core::Result<Link> {
        let (to_runner, mut from_client) = mpsc::channel::<Message>(16);
        let (to_client, from_runner) = mpsc::channel::<Message>(16);
        tokio::spawn(async move {
            while let Some(m) = from_client.recv().await {
                let Message::Text(t) = m else { continue };
                let json = |a: &Answer| Message::Text(serde_json::to_string(a).unwrap());
                match serde_json::from_str::<Request>(&t).unwrap() {
                    Request::Hello { id, .. } => {
                        let _ = to_client
                            .send(json(&Answer::Hello {
                                id,
                                protocol: 3,
                                pid: 1,
                                window: Some(1 << 20),
                            }))
                            .await;
                        let _ = to_client.send(Message::Binary(vec![0, 1])).await;
                        let _ = to_client.send(Message::Text("{\"op\":\"no such answer\"".into())).await;
                    }
                    Request::Stat { id, path, .. } => {
                        let meta = agentbox_protocol::runner::Meta {
                            name: path,
                            kind: agentbox_protocol::runner::Kind::File,
                            size: 3,
                            mode: 0o644,
                            mtime_ms: 0,
                        };
                        let _ = to_client.send(json(&Answer::Stat { id, meta })).await;
                    }
                    _ => {}
                }
            }
        });
        Ok(Link {
            tx: to_runner,
            rx: from_runner,
        })
    }

    fn describe(&self) -> String {
        "a scripted runner".into()
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn malformed_frames_are_logged_and_the_connection_goes_on() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let client = Client::new(Arc::new(Scripted));
    let ctx = Ctx::background().with_timeout(std::time::Duration::from_secs(10));
    let meta = client.stat("f.txt", false, &ctx).await.expect("the stat is answered");
    assert_eq!(meta.size, 3);
    // The malformed frames arrived before the stat's answer, so they are logged by now.
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("shorter than its header"), "{text}");
    assert!(text.contains("no answer"), "{text}");
}
