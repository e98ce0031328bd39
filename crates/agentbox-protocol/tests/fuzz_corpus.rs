//! The protocol fuzz targets' corpora (`fuzz/corpus/protocol_*`), run as tests so CI checks
//! them on stable. `AGENTBOX_WRITE_CORPUS=1` writes the seeds below into them.

use std::collections::BTreeMap;

use agentbox_protocol::runner::{Answer, FILE, MAX_MESSAGE, Message, Request, STDIN, STDOUT, frame, frame_seq};
use agentbox_protocol::{frame as json_frame, fuzzing, supervisor};

/// Run `property` over every file of `fuzz/corpus/<target>` and over `seeds`.
fn replay(target: &str, seeds: Vec<(&str, Vec<u8>)>, property: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    if std::env::var_os("AGENTBOX_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("the corpus directory").flatten() {
        property(&std::fs::read(e.path()).unwrap());
        n += 1;
    }
    assert!(
        n >= seeds.len(),
        "{target}'s corpus holds {n} inputs, fewer than its seeds"
    );
    for (_, bytes) in &seeds {
        property(bytes);
    }
}

/// Every request kind as a client writes it. Text, not values: a field added to a request
/// leaves its seeds as they are (they are what an older client sends).
const REQUESTS: &[&str] = &[
    r#"{"op":"run","id":1,"command":"echo hi","cwd":"work","env":{"MODE":"x"},"stdin":true}"#,
    r#"{"op":"run","id":2,"argv":["ls","-la"]}"#,
    r#"{"op":"stdin-end","id":1}"#,
    r#"{"op":"kill","id":1,"signal":"SIGTERM"}"#,
    r#"{"op":"read","id":3,"path":"work/a.txt","offset":10,"length":4096}"#,
    r#"{"op":"write","id":4,"path":"work/a.txt","mode":420}"#,
    r#"{"op":"stop","id":5}"#,
    r#"{"op":"hello","id":6,"protocol":3}"#,
    r#"{"op":"resume","id":7,"handle":18446744073709551615,"after":12}"#,
    r#"{"op":"forget","id":7}"#,
    r#"{"op":"stat","id":8,"path":"work/a.txt","follow":true}"#,
    r#"{"op":"list","id":9,"path":"work"}"#,
    r#"{"op":"mkdir","id":10,"path":"work/d","recursive":true}"#,
    r#"{"op":"remove","id":11,"path":"work/d","recursive":true,"force":false}"#,
    r#"{"op":"rename","id":12,"from":"work/a.txt","to":"work/b.txt"}"#,
    r#"{"op":"append","id":13,"path":"work/a.txt"}"#,
    r#"{"op":"truncate","id":14,"path":"work/a.txt","size":0}"#,
];

/// Every answer kind as a runner writes it.
const ANSWERS: &[&str] = &[
    r#"{"op":"exit","id":1,"code":143,"signal":15}"#,
    r#"{"op":"absent","id":3}"#,
    r#"{"op":"ok","id":4}"#,
    r#"{"op":"error","id":8,"message":"work/a.txt: no such file","code":"ENOENT","errno":2}"#,
    r#"{"op":"error","message":"a request the runner cannot read","code":"invalid"}"#,
    r#"{"op":"hello","id":6,"protocol":3,"pid":42}"#,
    r#"{"op":"started","id":2,"handle":9,"pid":43}"#,
    r#"{"op":"resumed","id":7,"from":13}"#,
    r#"{"op":"stat","id":8,"meta":{"name":"a.txt","kind":"file","size":3,"mode":420,"mtime_ms":-1}}"#,
    r#"{"op":"entries","id":9,"entries":[{"name":"d","kind":"dir","size":0,"mode":493,"mtime_ms":0}]}"#,
];

/// The op of a JSON text.
fn op(t: &str) -> String {
    serde_json::from_str::<serde_json::Value>(t).unwrap()["op"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_seeds_are_what_the_protocol_reads() {
    for t in REQUESTS {
        serde_json::from_str::<Request>(t).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    for t in ANSWERS {
        serde_json::from_str::<Answer>(t).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}

#[test]
fn the_frames_corpus_passes() {
    replay(
        "protocol_frames",
        vec![
            ("p2-stdout", frame(7, STDOUT, b"hi")),
            ("p2-file", frame(4, FILE, b"contents")),
            ("p2-empty-payload", frame(1, STDIN, b"")),
            ("p3-stdout", frame_seq(2, STDOUT, 42, b"output")),
            ("shorter-than-p2", vec![0, 0, 0, 1]),
            ("shorter-than-p3", frame(1, STDOUT, b"1234567")),
            ("empty", vec![]),
        ],
        fuzzing::frames,
    );
}

#[test]
fn the_stream_corpus_passes() {
    let enc = |m: Message| m.encode();
    let t = |v: Vec<u8>| Message::Text(String::from_utf8(v).unwrap());
    let mut session = Vec::new();
    for r in REQUESTS {
        session.extend(enc(t(r.as_bytes().to_vec())));
    }
    session.extend(enc(Message::Binary(frame(1, STDIN, b"input"))));
    let mut replies = Vec::new();
    for a in ANSWERS {
        replies.extend(enc(t(a.as_bytes().to_vec())));
    }
    replies.extend(enc(Message::Binary(frame_seq(2, STDOUT, 1, b"out"))));
    let over = ((MAX_MESSAGE + 1) as u32).to_be_bytes();
    replay(
        "protocol_stream",
        vec![
            ("requests", session),
            ("answers", replies),
            ("empty-message", vec![0, 0, 0, 0]),
            ("bad-kind", vec![0, 0, 0, 2, b'x', 1]),
            ("text-not-utf8", vec![0, 0, 0, 2, b't', 0xff]),
            ("over-the-bound", [&over[..], b"t{}"].concat()),
            ("at-the-bound", (MAX_MESSAGE as u32).to_be_bytes().to_vec()),
            (
                "cut",
                enc(Message::Text("{\"op\":\"stop\",\"id\":1}".into()))[..9].to_vec(),
            ),
        ],
        fuzzing::stream,
    );
}

#[test]
fn the_json_corpus_passes() {
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, r) in REQUESTS.iter().enumerate() {
        seeds.push((format!("request-{i:02}-{}", op(r)), r.as_bytes().to_vec()));
    }
    for (i, a) in ANSWERS.iter().enumerate() {
        seeds.push((format!("answer-{i:02}-{}", op(a)), a.as_bytes().to_vec()));
    }
    // As the seed's protocol-2 client writes them, what the runner cannot read, and flow
    // control's hello and ack (which a runner without it does not read).
    let raw: [(&str, &[u8]); 6] = [
        ("seed-run", br#"{"op":"run","id":1,"command":"echo hi","stdin":false}"#),
        (
            "hello-window",
            br#"{"op":"hello","id":1,"protocol":3,"window":1048576}"#,
        ),
        ("ack", br#"{"op":"ack","id":1,"stream":1,"seq":5}"#),
        ("unknown-op-with-id", br#"{"op":"launch","id":9}"#),
        ("id-too-large", br#"{"op":"stop","id":4294967296}"#),
        ("not-json", b"{\"op\":"),
    ];
    for (name, bytes) in raw {
        seeds.push((name.into(), bytes.to_vec()));
    }
    let exec = supervisor::Request::Exec {
        argv: vec!["sh".into(), "-c".into(), "true".into()],
        env: BTreeMap::from([("PATH".into(), "/usr/bin".into())]),
        cwd: "/work".into(),
    };
    let mut frames = json_frame::encode(&exec).unwrap();
    frames.extend(json_frame::encode(&supervisor::Request::Signal { signal: 15 }).unwrap());
    frames.extend(json_frame::encode(&supervisor::Request::Ping).unwrap());
    seeds.push(("supervisor-requests".into(), frames));
    let mut frames = json_frame::encode(&supervisor::Reply::Started { pid: 7 }).unwrap();
    frames.extend(json_frame::encode(&supervisor::Reply::Exit { code: 0, signal: None }).unwrap());
    seeds.push(("supervisor-replies".into(), frames));
    seeds.push((
        "supervisor-over-the-bound".into(),
        ((json_frame::MAX_FRAME + 1) as u32).to_be_bytes().to_vec(),
    ));
    replay(
        "protocol_json",
        seeds.iter().map(|(n, b)| (n.as_str(), b.clone())).collect(),
        fuzzing::json,
    );
}
