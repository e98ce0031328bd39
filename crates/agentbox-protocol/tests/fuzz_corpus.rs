//! The protocol fuzz targets' corpora (`fuzz/corpus/protocol_*`), run as tests so CI checks
//! them on stable. `AGENTBOX_WRITE_CORPUS=1` writes the seeds below into them.

use std::collections::BTreeMap;

use agentbox_protocol::runner::{Answer, FILE, MAX_MESSAGE, Message, Meta, Request, STDIN, STDOUT, frame, frame_seq};
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

fn text(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn requests() -> Vec<Request> {
    let path = || "work/a.txt".to_string();
    vec![
        Request::Run {
            id: 1,
            command: Some("echo hi".into()),
            argv: None,
            cwd: Some("work".into()),
            env: Some(BTreeMap::from([("MODE".into(), "x".into())])),
            stdin: true,
        },
        Request::Run {
            id: 2,
            command: None,
            argv: Some(vec!["ls".into(), "-la".into()]),
            cwd: None,
            env: None,
            stdin: false,
        },
        Request::StdinEnd { id: 1 },
        Request::Kill {
            id: 1,
            signal: Some("SIGTERM".into()),
        },
        Request::Read {
            id: 3,
            path: path(),
            offset: Some(10),
            length: Some(4096),
        },
        Request::Write {
            id: 4,
            path: path(),
            mode: Some(0o644),
        },
        Request::Stop { id: 5 },
        Request::Hello { id: 6, protocol: 3 },
        Request::Resume {
            id: 7,
            handle: u64::MAX,
            after: 12,
        },
        Request::Forget { id: 7 },
        Request::Stat {
            id: 8,
            path: path(),
            follow: true,
        },
        Request::List {
            id: 9,
            path: "work".into(),
        },
        Request::Mkdir {
            id: 10,
            path: "work/d".into(),
            recursive: true,
        },
        Request::Remove {
            id: 11,
            path: "work/d".into(),
            recursive: true,
            force: false,
        },
        Request::Rename {
            id: 12,
            from: path(),
            to: "work/b.txt".into(),
        },
        Request::Append { id: 13, path: path() },
        Request::Truncate {
            id: 14,
            path: path(),
            size: 0,
        },
    ]
}

fn answers() -> Vec<Answer> {
    let meta = Meta {
        name: "a.txt".into(),
        kind: agentbox_protocol::runner::Kind::File,
        size: 3,
        mode: 0o644,
        mtime_ms: -1,
    };
    vec![
        Answer::Exit {
            id: 1,
            code: 143,
            signal: Some(15),
        },
        Answer::Absent { id: 3 },
        Answer::Ok { id: 4 },
        Answer::Error {
            id: Some(8),
            message: "work/a.txt: no such file".into(),
            code: Some("ENOENT".into()),
            errno: Some(2),
        },
        Answer::error(None, "invalid", "a request the runner cannot read"),
        Answer::Hello {
            id: 6,
            protocol: 3,
            pid: 42,
        },
        Answer::Started {
            id: 2,
            handle: 9,
            pid: 43,
        },
        Answer::Resumed { id: 7, from: 13 },
        Answer::Stat {
            id: 8,
            meta: meta.clone(),
        },
        Answer::Entries {
            id: 9,
            entries: vec![meta.clone(), meta],
        },
    ]
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
    for r in requests() {
        session.extend(enc(t(text(&r))));
    }
    session.extend(enc(Message::Binary(frame(1, STDIN, b"input"))));
    let mut replies = Vec::new();
    for a in answers() {
        replies.extend(enc(t(text(&a))));
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
    let op = |v: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(v).unwrap()["op"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (i, r) in requests().iter().enumerate() {
        seeds.push((format!("request-{i:02}-{}", op(&text(r))), text(r)));
    }
    for (i, a) in answers().iter().enumerate() {
        seeds.push((format!("answer-{i:02}-{}", op(&text(a))), text(a)));
    }
    // As the seed's protocol-2 client writes them, and what the runner cannot read.
    let raw: [(&str, &[u8]); 4] = [
        ("seed-run", br#"{"op":"run","id":1,"command":"echo hi","stdin":false}"#),
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
