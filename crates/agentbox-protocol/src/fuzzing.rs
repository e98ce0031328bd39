//! The properties the protocol's fuzz targets check, shared with the test that runs their
//! corpora in CI (`tests/fuzz_corpus.rs`). Whatever the bytes, no decoder panics, none lets a
//! peer make the reader allocate past the protocol's bound, and what decodes encodes back to
//! the very bytes it came from (binary frames and stream messages), or to a value that
//! decodes to itself (JSON).

use std::io::Cursor;

use crate::runner::{
    Answer, KIND_BINARY, KIND_TEXT, MAX_MESSAGE, Message, Request, frame, frame_seq, stream_len, unframe, unframe_seq,
};
use crate::{frame as json_frame, supervisor};

/// A binary frame of either protocol: `unframe` (protocol 2: `id u32, stream u8, bytes`) and
/// `unframe_seq` (protocol 3: `id u32, stream u8, seq u64, bytes`) refuse exactly what is
/// shorter than their header, and `frame`/`frame_seq` give back the bytes they read.
pub fn frames(data: &[u8]) {
    match unframe(data) {
        None => assert!(data.len() < 5, "a {}-byte frame was refused", data.len()),
        Some((id, stream, bytes)) => {
            assert_eq!(bytes.len(), data.len() - 5, "the payload is not the rest of the frame");
            assert_eq!(frame(id, stream, bytes), data, "frame(unframe(f)) != f");
        }
    }
    match unframe_seq(data) {
        None => assert!(data.len() < 13, "a {}-byte protocol-3 frame was refused", data.len()),
        Some((id, stream, seq, bytes)) => {
            assert_eq!(bytes.len(), data.len() - 13, "the payload is not the rest of the frame");
            assert_eq!(
                frame_seq(id, stream, seq, bytes),
                data,
                "frame_seq(unframe_seq(f)) != f"
            );
        }
    }
    // And the other way: whatever is framed unframes to itself.
    let (id, stream, seq) = (word(data, 0) as u32, data.first().copied().unwrap_or(0), word(data, 1));
    assert_eq!(unframe(&frame(id, stream, data)), Some((id, stream, data)));
    assert_eq!(
        unframe_seq(&frame_seq(id, stream, seq, data)),
        Some((id, stream, seq, data))
    );
}

/// Eight bytes of `data` from the `i`th, as a number (zeros past the end).
fn word(data: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    for (k, b) in data.iter().skip(i).take(8).enumerate() {
        w[k] = *b;
    }
    u64::from_be_bytes(w)
}

/// A byte stream of [`Message`]s (the runner's stdio and unix socket, a relay exec), read as
/// both ends read it: a length refused over [`MAX_MESSAGE`] before a byte is allocated for it
/// (the stream then ends: it is out of step), each message decoded, and what decodes encodes
/// back to its bytes. Each text is then read as a request and as an answer, each binary
/// message as a frame.
pub fn stream(data: &[u8]) {
    let mut rest = data;
    while rest.len() >= 4 {
        let prefix: [u8; 4] = rest[..4].try_into().unwrap();
        let announced = u32::from_be_bytes(prefix) as usize;
        let n = match stream_len(prefix) {
            Ok(n) => n,
            Err(why) => {
                assert!(announced > MAX_MESSAGE, "{announced} bytes refused: {why}");
                assert!(
                    why.contains(&announced.to_string()),
                    "the refusal names no length: {why}"
                );
                return;
            }
        };
        // The reader allocates what the prefix announces: never over the bound.
        assert!(
            n == announced && n <= MAX_MESSAGE,
            "{announced} bytes announced, {n} allowed"
        );
        let Some(body) = rest.get(4..4 + n) else { return }; // cut: the stream ends
        rest = &rest[4 + n..];
        let decoded = Message::decode(body.to_vec());
        let good = match body.split_first() {
            None => false,
            Some((&KIND_TEXT, t)) => std::str::from_utf8(t).is_ok(),
            Some((&KIND_BINARY, _)) => true,
            Some(_) => false,
        };
        assert_eq!(decoded.is_ok(), good, "decoding {body:?}: {decoded:?}");
        let Ok(m) = decoded else { continue };
        assert_eq!(m.encode(), [&prefix[..], body].concat(), "encode(decode(m)) != m");
        match &m {
            Message::Text(t) => text(t),
            Message::Binary(b) => frames(b),
        }
    }
    // And the other way: a message within the bound decodes from its encoding.
    for m in [
        Message::Text(String::from_utf8_lossy(data).into_owned()),
        Message::Binary(data.to_vec()),
    ] {
        let bytes = m.encode();
        if bytes.len() - 4 > MAX_MESSAGE {
            continue; // no reader accepts it, and no sender may send it
        }
        assert_eq!(stream_len(bytes[..4].try_into().unwrap()), Ok(bytes.len() - 4));
        assert_eq!(Message::decode(bytes[4..].to_vec()), Ok(m));
    }
}

/// JSON text as the runner reads a request, as a client reads an answer, and as the local
/// box supervisor and its host read theirs: what parses serialises to JSON that parses to
/// the same value (and serialises to the same text).
pub fn json(data: &[u8]) {
    if let Ok(t) = std::str::from_utf8(data) {
        text(t);
    }
    // The supervisor's connection: length-prefixed JSON frames, the length bounded before the
    // body is read. Each reader stops at the first error, as the supervisor does.
    for read in [
        supervisor_requests as fn(&mut Cursor<&[u8]>) -> bool,
        supervisor_replies,
    ] {
        let mut c = Cursor::new(data);
        while read(&mut c) {}
    }
}

/// One text message of a runner connection.
fn text(t: &str) {
    match serde_json::from_str::<Request>(t) {
        Ok(r) => {
            round_trip(&r);
            let _ = (r.id(), r.is_extended());
        }
        Err(_) => {
            // The runner names the id of a request it cannot read, when the text has one.
            let _ = serde_json::from_str::<serde_json::Value>(t)
                .ok()
                .and_then(|v| v.get("id")?.as_u64());
        }
    }
    if let Ok(a) = serde_json::from_str::<Answer>(t) {
        round_trip(&a);
    }
}

fn supervisor_requests(c: &mut Cursor<&[u8]>) -> bool {
    frame_read::<supervisor::Request>(c)
}

fn supervisor_replies(c: &mut Cursor<&[u8]>) -> bool {
    frame_read::<supervisor::Reply>(c)
}

/// Read one supervisor frame; false at the end or an error.
fn frame_read<T>(c: &mut Cursor<&[u8]>) -> bool
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let at = c.position() as usize;
    let data = *c.get_ref();
    if let Some(prefix) = data.get(at..at + 4) {
        let announced = u32::from_be_bytes(prefix.try_into().unwrap()) as usize;
        let allowed = json_frame::body_len(prefix.try_into().unwrap());
        // The reader allocates what the prefix announces: only within the bound.
        assert_eq!(
            allowed.is_ok(),
            announced <= json_frame::MAX_FRAME,
            "{announced}: {allowed:?}"
        );
    }
    match json_frame::read_sync::<T>(c) {
        Ok(Some(m)) => {
            let bytes = json_frame::encode(&m).expect("a message read encodes");
            let back: T = json_frame::decode(&bytes[4..]).expect("an encoded message decodes");
            assert_eq!(back, m, "decode(encode(m)) != m");
            true
        }
        Ok(None) | Err(_) => false,
    }
}

/// `v` serialises to JSON that parses back to `v`, and serialises again to the same text.
fn round_trip<T>(v: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let s = serde_json::to_string(v).expect("a parsed message serialises");
    let back: T = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s} does not parse back: {e}"));
    assert_eq!(&back, v, "{s} parses to another value");
    assert_eq!(serde_json::to_string(&back).unwrap(), s, "serialising is not stable");
}
