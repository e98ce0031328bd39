//! The processes a runner keeps, on the wire: several readers of one process, `ps`, a `run`
//! sent again under its key, terminals, deadlines kept in the box, detached processes whose
//! output is a ring, and requests by handle, each answered.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

async fn hello(ws: &mut Socket) {
    send_text(ws, json!({"op":"hello","id":0,"protocol":3})).await;
    let Got::Text(h) = next(ws).await else { panic!() };
    assert_eq!(h["protocol"], 3, "{h}");
}

/// The bytes of protocol-3 output frames for `id`, and whether they were numbered on from
/// `from` with no gap.
fn output(frames: &[Got], id: u32, from: u64) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut next = from;
    let mut whole = true;
    for f in frames {
        if let Got::Binary(b) = f
            && b.len() >= 13
            && u32::from_be_bytes(b[..4].try_into().unwrap()) == id
        {
            let seq = u64::from_be_bytes(b[5..13].try_into().unwrap());
            whole &= seq == next;
            next = seq + (b.len() - 13) as u64;
            out.extend_from_slice(&b[13..]);
        }
    }
    (out, whole)
}

async fn ps(ws: &mut Socket, id: u32) -> Vec<Value> {
    send_text(ws, json!({"op":"ps","id":id})).await;
    let (_, a) = until(ws, id, "processes").await;
    a["processes"].as_array().unwrap().clone()
}

/// A second connection reading a process does not take it from the first: both get every
/// byte and the exit (the first got nothing more, and no exit, once another resumed it).
#[tokio::test]
async fn two_connections_read_one_process_and_both_get_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut a = connect(&r.addr).await;
    hello(&mut a).await;
    send_text(
        &mut a,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.3; for i in $(seq 1 200); do echo line $i; done"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut a).await else { panic!() };
    let handle = s["handle"].as_u64().unwrap();
    let mut b = connect(&r.addr).await;
    hello(&mut b).await;
    send_text(&mut b, json!({"op":"resume","id":5,"handle":handle,"after":0})).await;
    let (fa, ea) = until(&mut a, 1, "exit").await;
    let (fb, eb) = until(&mut b, 5, "exit").await;
    assert_eq!((ea["code"].as_i64(), eb["code"].as_i64()), (Some(0), Some(0)));
    let want: String = (1..=200).map(|i| format!("line {i}\n")).collect();
    let (oa, wa) = output(&fa, 1, 0);
    let (ob, wb) = output(&fb, 5, 0);
    assert!(wa && wb, "both numbered from 0 with no gap");
    assert_eq!(String::from_utf8(oa).unwrap(), want, "the first reader");
    assert_eq!(String::from_utf8(ob).unwrap(), want, "the second reader");
}

/// `ps` lists running and ended processes with their argv, and a forget by handle is
/// answered and takes the process out of the listing.
#[tokio::test]
async fn ps_lists_processes_and_forget_by_handle_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, json!({"op":"run","id":1,"argv":["sleep","30"],"stdin":false})).await;
    let (_, s1) = until(&mut ws, 1, "started").await;
    send_text(
        &mut ws,
        json!({"op":"run","id":2,"argv":["sh","-c","exit 3"],"stdin":false}),
    )
    .await;
    let (_, s2) = until(&mut ws, 2, "started").await;
    until(&mut ws, 2, "exit").await;
    let list = ps(&mut ws, 3).await;
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["handle"], s1["handle"]);
    assert_eq!(list[0]["argv"], json!(["sleep", "30"]));
    assert!(list[0].get("exit").is_none(), "running: {}", list[0]);
    assert_eq!(list[1]["exit"]["code"], 3, "{}", list[1]);
    send_text(&mut ws, json!({"op":"forget","id":4,"handle":s2["handle"]})).await;
    assert_eq!(until(&mut ws, 4, "ok").await.1, json!({"op":"ok","id":4}));
    let list = ps(&mut ws, 5).await;
    assert_eq!(list.len(), 1, "forgotten: {list:?}");
    send_text(&mut ws, json!({"op":"kill","id":6,"handle":s1["handle"]})).await;
    assert_eq!(until(&mut ws, 6, "ok").await.1["op"], "ok");
    send_text(&mut ws, json!({"op":"kill","id":7,"handle":999})).await;
    let (_, e) = until(&mut ws, 7, "error").await;
    assert_eq!(e["code"], "not_found", "{e}");
}

/// A `run` whose key the runner knows starts nothing new: it is answered `started` with the
/// same handle, and the connection reads the process from its first byte.
#[tokio::test]
async fn a_run_sent_again_under_its_key_is_the_same_process() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    let run = |id: u32| json!({"op":"run","id":id,"argv":["sh","-c","echo once >> ran; echo hi; sleep 0.5"],"stdin":false,"key":"k-1"});
    send_text(&mut ws, run(1)).await;
    let (_, s1) = until(&mut ws, 1, "started").await;
    drop(ws);
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, run(2)).await;
    let (_, s2) = until(&mut ws, 2, "started").await;
    assert_eq!(s1["handle"], s2["handle"]);
    let (frames, exit) = until(&mut ws, 2, "exit").await;
    assert_eq!(exit["code"], 0);
    assert_eq!(output(&frames, 2, 0).0, b"hi\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("ran")).unwrap(), "once\n");
    let long = "k".repeat(200);
    send_text(&mut ws, json!({"op":"run","id":3,"argv":["true"],"key":long})).await;
    let (_, e) = until(&mut ws, 3, "error").await;
    assert_eq!(e["code"], "invalid", "{e}");
}

/// A terminal: the program sees one, of the size asked, then of the size a resize set; a
/// process without one refuses a resize.
#[tokio::test]
async fn a_tty_run_sees_a_terminal_and_its_resize() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","tty; stty size; read x; stty size; echo \"$TERM\""],"stdin":true,"tty":{"rows":24,"cols":80}}),
    )
    .await;
    until(&mut ws, 1, "started").await;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&output(&seen, 1, 0).0).contains("24 80") {
        seen.push(next(&mut ws).await);
    }
    send_text(&mut ws, json!({"op":"resize","id":1,"rows":40,"cols":100})).await;
    let (more, ok) = until(&mut ws, 1, "ok").await;
    assert_eq!(ok["op"], "ok");
    seen.extend(more);
    send_binary(&mut ws, [&1u32.to_be_bytes()[..], &[0], b"go\n"].concat()).await;
    let (more, exit) = until(&mut ws, 1, "exit").await;
    seen.extend(more);
    assert_eq!(exit["code"], 0, "{exit}");
    let (out, whole) = output(&seen, 1, 0);
    let text = String::from_utf8_lossy(&out).replace('\r', "");
    assert!(whole);
    assert!(text.starts_with("/dev/pts/"), "{text:?}");
    assert!(text.contains("24 80\n"), "{text:?}");
    assert!(text.contains("40 100\n"), "{text:?}");
    assert!(text.ends_with("xterm-256color\n"), "{text:?}");

    send_text(&mut ws, json!({"op":"run","id":2,"argv":["sleep","5"],"stdin":false})).await;
    until(&mut ws, 2, "started").await;
    send_text(&mut ws, json!({"op":"resize","id":2,"rows":10,"cols":10})).await;
    let (_, e) = until(&mut ws, 2, "error").await;
    assert_eq!(e["code"], "unsupported", "{e}");
    send_text(
        &mut ws,
        json!({"op":"run","id":3,"argv":["true"],"tty":{"rows":0,"cols":80}}),
    )
    .await;
    let (_, e) = until(&mut ws, 3, "error").await;
    assert_eq!(e["code"], "invalid", "{e}");
}

/// The runner keeps a run's deadline with no client: the process is killed at it, and a
/// reader that comes after reads the exit as a timeout.
#[tokio::test]
async fn a_deadline_ends_the_process_with_no_client_and_the_next_reader_reads_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","echo start; sleep 30; echo never"],"stdin":false,"timeout_ms":500}),
    )
    .await;
    let (_, s) = until(&mut ws, 1, "started").await;
    drop(ws);
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    // Asked until it ended (it would sleep for 30 s): the deadline, not its end, ended it.
    let until_end = tokio::time::Instant::now() + Duration::from_secs(20);
    let list = loop {
        let list = ps(&mut ws, 2).await;
        if list[0].get("exit").is_some() || tokio::time::Instant::now() > until_end {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        list[0]["exit"],
        json!({"code":137,"signal":9,"timeout":true}),
        "{list:?}"
    );
    send_text(&mut ws, json!({"op":"resume","id":3,"handle":s["handle"],"after":0})).await;
    let (frames, exit) = until(&mut ws, 3, "exit").await;
    assert_eq!(exit, json!({"op":"exit","id":3,"code":137,"signal":9,"timeout":true}));
    assert_eq!(output(&frames, 3, 0).0, b"start\n");
}

/// A detached process nobody reads is not held up: its output is a ring of the bound, and a
/// reader that comes later is told where its replay starts; input by handle reaches it.
#[tokio::test]
async fn a_detached_process_keeps_a_ring_and_a_late_reader_is_told_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "4096"], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.2; head -c 100000 /dev/zero | tr '\\0' x; read line; echo \"got $line\""],"stdin":true,"detach":true}),
    )
    .await;
    let (_, s) = until(&mut ws, 1, "started").await;
    let handle = s["handle"].as_u64().unwrap();
    drop(ws);
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    // Not held: the program wrote all of it with nobody reading.
    let until_end = tokio::time::Instant::now() + Duration::from_secs(10);
    while ps(&mut ws, 2).await[0]["end"].as_u64() != Some(100_000) {
        assert!(
            tokio::time::Instant::now() < until_end,
            "the detached program was held up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    send_text(&mut ws, json!({"op":"input","id":3,"handle":handle,"close":true})).await;
    send_binary(&mut ws, [&3u32.to_be_bytes()[..], &[0], b"hello\n"].concat()).await;
    assert_eq!(until(&mut ws, 3, "ok").await.1["op"], "ok");
    send_text(&mut ws, json!({"op":"resume","id":4,"handle":handle,"after":0})).await;
    let (_, res) = until(&mut ws, 4, "resumed").await;
    let from = res["from"].as_u64().unwrap();
    // The ring keeps at least half its bound.
    assert!(
        from > 0 && from <= 100_010 - 2048,
        "the replay starts past the lost bytes: {res}"
    );
    let (frames, exit) = until(&mut ws, 4, "exit").await;
    assert_eq!(exit["code"], 0);
    let (out, whole) = output(&frames, 4, from);
    assert!(whole);
    assert!(
        out.ends_with(b"got hello\n"),
        "{:?}",
        String::from_utf8_lossy(&out[out.len().saturating_sub(40)..])
    );
    assert!(out.len() <= 4096 + 16, "no more than the ring: {}", out.len());
}

/// Read `id` on `ws` to its exit, acknowledging each frame as it comes: the bytes, and
/// whether they were numbered on from `from` with no gap.
async fn read_acking(ws: &mut Socket, id: u32, from: u64) -> (u64, bool, Value) {
    let mut next = from;
    let mut whole = true;
    let mut bytes = 0u64;
    loop {
        match common::next(ws).await {
            Got::Binary(b) if u32::from_be_bytes(b[..4].try_into().unwrap()) == id => {
                let seq = u64::from_be_bytes(b[5..13].try_into().unwrap());
                whole &= seq == next;
                next = seq + (b.len() - 13) as u64;
                bytes += (b.len() - 13) as u64;
                send_text(ws, json!({"op":"ack","id":id,"stream":b[4],"seq":next})).await;
            }
            Got::Text(t) if t["id"] == id && t["op"] == "exit" => return (bytes, whole, t),
            _ => {}
        }
    }
}

async fn hello_window(ws: &mut Socket, window: u64) {
    send_text(ws, json!({"op":"hello","id":0,"protocol":3,"window":window})).await;
    let Got::Text(h) = next(ws).await else { panic!() };
    assert_eq!(h["window"], window, "{h}");
}

/// A second holder that drops while the first still reads leaves nothing holding the process
/// behind it: the first reads all of it (the dropped one's acknowledgements were kept, and the
/// process froze at the bound once the first had read that far).
#[tokio::test]
async fn a_second_holder_that_drops_does_not_freeze_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "65536"], dir.path());
    let mut a = connect(&r.addr).await;
    hello_window(&mut a, 32768).await;
    send_text(
        &mut a,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.5; head -c 1048576 /dev/zero"],"stdin":false}),
    )
    .await;
    let (_, s) = until(&mut a, 1, "started").await;
    let mut b = connect(&r.addr).await;
    hello_window(&mut b, 32768).await;
    send_text(&mut b, json!({"op":"resume","id":2,"handle":s["handle"],"after":0})).await;
    until(&mut b, 2, "resumed").await;
    drop(b);
    let (bytes, whole, exit) = read_acking(&mut a, 1, 0).await;
    assert_eq!((bytes, whole, exit["code"].as_i64()), (1 << 20, true, Some(0)));
}

/// A holder that resumes from before where the dropped holder had acknowledged (another
/// client taking over from 0) gets all of it: its window is not stalled by bytes counted as
/// taken that it was sent again.
#[tokio::test]
async fn a_holder_taking_over_from_an_earlier_byte_reads_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "262144"], dir.path());
    let mut a = connect(&r.addr).await;
    hello_window(&mut a, 65536).await;
    send_text(
        &mut a,
        json!({"op":"run","id":1,"argv":["head","-c","2097152","/dev/zero"],"stdin":false}),
    )
    .await;
    let (_, s) = until(&mut a, 1, "started").await;
    // Read and acknowledge 128 KB, then drop: what was acknowledged may go, the rest is held.
    let mut next = 0u64;
    while next < 131072 {
        if let Got::Binary(b) = common::next(&mut a).await {
            next = u64::from_be_bytes(b[5..13].try_into().unwrap()) + (b.len() - 13) as u64;
            send_text(&mut a, json!({"op":"ack","id":1,"stream":1,"seq":next})).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut b = connect(&r.addr).await;
    hello_window(&mut b, 65536).await;
    send_text(&mut b, json!({"op":"resume","id":2,"handle":s["handle"],"after":0})).await;
    let (_, res) = until(&mut b, 2, "resumed").await;
    let from = res["from"].as_u64().unwrap();
    assert!(from <= next, "nothing unacknowledged was let go: {res}");
    let (bytes, whole, exit) = read_acking(&mut b, 2, from).await;
    assert!(whole, "no gap after {from}");
    assert_eq!((from + bytes, exit["code"].as_i64()), (2097152, Some(0)));
}

/// A program that writes past the bound and exits while its holder is away loses none of its
/// tail: the pipe's last bytes wait for the holder (they were let go 100 ms after the exit).
#[tokio::test]
async fn the_tail_of_a_program_that_ended_at_the_bound_waits_for_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "16384"], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.3; head -c 60000 /dev/zero"],"stdin":false}),
    )
    .await;
    let (_, s) = until(&mut ws, 1, "started").await;
    drop(ws);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, json!({"op":"resume","id":2,"handle":s["handle"],"after":0})).await;
    let (frames, exit) = until(&mut ws, 2, "exit").await;
    assert_eq!(exit["code"], 0);
    let (out, whole) = output(&frames, 2, 0);
    assert!(whole);
    assert_eq!(out.len(), 60000, "every byte, the pipe's tail included");
}

/// Forgetting a process that another connection reads does not leave that reader without
/// its exit.
#[tokio::test]
async fn a_forgotten_process_still_ends_for_its_other_readers() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut a = connect(&r.addr).await;
    hello(&mut a).await;
    send_text(
        &mut a,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.5; echo bye"],"stdin":false}),
    )
    .await;
    let (_, s) = until(&mut a, 1, "started").await;
    let mut b = connect(&r.addr).await;
    hello(&mut b).await;
    send_text(&mut b, json!({"op":"resume","id":2,"handle":s["handle"],"after":0})).await;
    until(&mut b, 2, "resumed").await;
    send_text(&mut a, json!({"op":"forget","id":3,"handle":s["handle"]})).await;
    until(&mut a, 3, "ok").await;
    let (frames, exit) = until(&mut b, 2, "exit").await;
    assert_eq!(exit["code"], 0);
    assert_eq!(output(&frames, 2, 0).0, b"bye\n");
}

/// A reader that asks for no output (`window: 0`) gets the exit alone.
#[tokio::test]
async fn a_reader_with_no_window_gets_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","echo out; exit 4"],"stdin":false,"detach":true}),
    )
    .await;
    let (_, s) = until(&mut ws, 1, "started").await;
    until(&mut ws, 1, "exit").await;
    send_text(
        &mut ws,
        json!({"op":"resume","id":2,"handle":s["handle"],"after":0,"hold":false,"window":0}),
    )
    .await;
    let (frames, exit) = until(&mut ws, 2, "exit").await;
    assert_eq!(exit["code"], 4);
    assert!(output(&frames, 2, 0).0.is_empty(), "no output was asked for");
}

/// Input to a process that does not read its stdin holds up only its own answer: the
/// connection's other requests are answered meanwhile.
#[tokio::test]
async fn input_a_process_does_not_read_holds_up_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sleep","30"],"stdin":true,"detach":true}),
    )
    .await;
    let (_, s) = until(&mut ws, 1, "started").await;
    // More inputs than the pipe and the stdin queue of a program that never reads take.
    for i in 0..24 {
        let id: u32 = 100 + i;
        send_text(&mut ws, json!({"op":"input","id":id,"handle":s["handle"]})).await;
        send_binary(&mut ws, [&id.to_be_bytes()[..], &[0], &vec![b'x'; 64 << 10]].concat()).await;
    }
    let list = ps(&mut ws, 20).await;
    assert_eq!(list.len(), 1, "ps was answered while the input waits");
    send_text(&mut ws, json!({"op":"kill","id":21,"handle":s["handle"]})).await;
    until(&mut ws, 21, "ok").await;
}
