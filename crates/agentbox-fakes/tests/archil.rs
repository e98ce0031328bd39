//! The fake Archil's own rules, asked over plain HTTP: the key in its three forms, the
//! control plane's envelope and paging, exec (exit codes, U+FFFD, env, mounts, validation,
//! the limit's 504), delegation checkouts (FIFO order, the queue's timeout, object writes
//! refused meanwhile), the object API (all 256 byte values, HEAD, append, listings with
//! directories, deletes), keys that try to leave their disk, writes through a link at the
//! key's leaf, and scripted errors.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
use serde_json::{Value, json};

mod common;
use common::http::{self, Answer};

const KEY: &str = "rules-key";

async fn fake(tweak: impl FnOnce(&mut FakeArchilOptions)) -> FakeArchil {
    agentbox_testing::runner::ensure();
    let mut o = FakeArchilOptions {
        api_key: KEY.into(),
        ..Default::default()
    };
    tweak(&mut o);
    FakeArchil::start(o).await.expect("the fake starts")
}

/// An S3 `<Error>`'s code, with a RequestId beside it.
trait S3Error {
    fn s3_code(&self) -> String;
}

impl S3Error for Answer {
    fn s3_code(&self) -> String {
        let t = self.text();
        assert!(t.contains("<RequestId>"), "no RequestId in {t}");
        between(&t, "<Code>", "</Code>").unwrap_or_else(|| panic!("no <Code> in {t}"))
    }
}

fn between(t: &str, a: &str, b: &str) -> Option<String> {
    let s = t.find(a)? + a.len();
    let e = t[s..].find(b)? + s;
    Some(t[s..e].to_string())
}

fn all(t: &str, a: &str, b: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(s) = rest.find(a) {
        let r = &rest[s + a.len()..];
        let Some(e) = r.find(b) else { break };
        out.push(r[..e].to_string());
        rest = &r[e + b.len()..];
    }
    out
}

/// One request with `auth` as the Authorization header, read to its end within 60 s.
async fn raw(
    a: &FakeArchil,
    auth: Option<&str>,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut headers: Vec<(&str, &str)> = auth.map(|k| ("authorization", k)).into_iter().collect();
    headers.extend_from_slice(extra);
    http::request(a.addr(), method, path, &headers, body.to_vec(), Duration::from_secs(60)).await
}

fn auth() -> String {
    format!("key-{KEY}")
}

async fn api(a: &FakeArchil, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let b = body.map(|v| serde_json::to_vec(v).unwrap()).unwrap_or_default();
    raw(
        a,
        Some(&auth()),
        method,
        path,
        &[("Content-Type", "application/json")],
        &b,
    )
    .await
}

async fn s3(a: &FakeArchil, method: &str, path: &str, body: &[u8]) -> Answer {
    raw(a, Some(&auth()), method, &format!("/s3/{path}"), &[], body).await
}

/// Exec on one disk; the answer's `data`, asserting a 200.
async fn exec1(a: &FakeArchil, disk: &str, command: &str) -> Value {
    let r = api(
        a,
        "POST",
        &format!("/api/disks/{disk}/exec"),
        Some(&json!({"command": command})),
    )
    .await;
    assert_eq!(r.status, 200, "exec {command:?}: {}", r.text());
    assert_eq!(r.json()["success"], true);
    r.json()["data"].clone()
}

async fn exec_many(a: &FakeArchil, disks: Value, command: &str) -> Answer {
    api(
        a,
        "POST",
        "/api/exec",
        Some(&json!({"disks": disks, "command": command})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_asked_in_its_three_forms_and_errors_are_enveloped() {
    let a = fake(|_| {}).await;
    for good in [
        format!("key-{KEY}"),
        format!("Bearer key-{KEY}"),
        format!("Bearer {KEY}"),
    ] {
        let r = raw(&a, Some(&good), "GET", "/api/disks", &[], b"").await;
        assert_eq!(r.status, 200, "{good}: {}", r.text());
        assert_eq!(r.json(), json!({"success": true, "data": []}));
    }
    for bad in [
        None,
        Some(KEY),
        Some("key-wrong"),
        Some("Bearer wrong"),
        Some("Basic cnVsZXMta2V5"),
    ] {
        let r = raw(&a, bad, "GET", "/api/disks", &[], b"").await;
        assert_eq!(r.status, 401, "{bad:?}");
        let e = r.json();
        assert_eq!(
            (e["success"].clone(), e["code"].clone()),
            (json!(false), json!("unauthorized"))
        );
        assert!(e["error"].as_str().is_some_and(|m| !m.is_empty()));
        let r = raw(&a, bad, "GET", "/s3/dsk-0000000000000000?list-type=2", &[], b"").await;
        assert_eq!((r.status, r.s3_code()), (403, "AccessDenied".to_string()), "{bad:?}");
        let r = raw(&a, bad, "HEAD", "/s3/dsk-0000000000000000/k", &[], b"").await;
        assert_eq!(r.status, 403);
        assert!(r.body.is_empty());
    }
    // A key configured with `key-` is the same key.
    let b = FakeArchil::start(FakeArchilOptions {
        api_key: format!("key-{KEY}"),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(raw(&b, Some(&auth()), "GET", "/api/disks", &[], b"").await.status, 200);
    b.shutdown().await;
    let r = api(&a, "GET", "/api/disks/dsk-0123456789abcdef", None).await;
    assert_eq!((r.status, r.json()["code"].clone()), (404, json!("not_found")));
    let r = api(&a, "GET", "/api/sandboxes", None).await;
    assert_eq!((r.status, r.json()["success"].clone()), (404, json!(false)));
    let r = raw(&a, Some(&auth()), "POST", "/api/disks", &[], b"{not json").await;
    assert_eq!((r.status, r.json()["code"].clone()), (400, json!("invalid_request")));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_are_made_listed_in_pages_read_and_deleted() {
    let a = fake(|_| {}).await;
    let r = api(&a, "POST", "/api/disks", Some(&json!({"name": "first"}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json()["data"].clone();
    assert_eq!(d["authorizedUsers"], json!([]));
    let first = d["diskId"].as_str().unwrap().to_string();
    assert!(
        first.len() == 20 && first.starts_with("dsk-") && first[4..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{first}"
    );
    assert!(a.disk_dir(&first).is_dir());
    let second = a.create_disk("second").unwrap();
    let third = a.create_disk("third").unwrap();
    let r = api(&a, "GET", &format!("/api/disks/{first}"), None).await;
    let disk = r.json()["data"].clone();
    for f in [
        "id",
        "name",
        "organization",
        "status",
        "provider",
        "region",
        "createdAt",
        "sandboxDisk",
    ] {
        assert!(!disk[f].is_null(), "{f} in {disk}");
    }
    assert_eq!(
        (disk["name"].clone(), disk["status"].clone(), disk["region"].clone()),
        (json!("first"), json!("available"), json!("aws-us-east-1"))
    );
    // Pages of one, in creation order, the cursor absent on the last.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/api/disks?limit=1&cursor={c}"),
            None => "/api/disks?limit=1".to_string(),
        };
        let page = api(&a, "GET", &path, None).await.json();
        for d in page["data"].as_array().unwrap() {
            seen.push(d["id"].as_str().unwrap().to_string());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, vec![first.clone(), second.clone(), third.clone()]);
    let named = api(&a, "GET", "/api/disks?name=second", None).await.json();
    assert_eq!(named["data"].as_array().unwrap().len(), 1);
    assert_eq!(named["data"][0]["id"], json!(second));
    for (body, code, status) in [
        (json!({"name": "first"}), "conflict", 409),
        (json!({"name": "bad name"}), "invalid_request", 400),
        (json!({}), "invalid_request", 400),
        (json!({"name": "x", "mounts": [{"type": "s3"}]}), "invalid_request", 400),
        (json!({"name": "x", "bogus": 1}), "invalid_request", 400),
    ] {
        let r = api(&a, "POST", "/api/disks", Some(&body)).await;
        assert_eq!((r.status, r.json()["code"].clone()), (status, json!(code)), "{body}");
    }
    assert!(a.create_disk("first").is_err());
    for bad in ["limit=0", "limit=x", "cursor=nope", "q=abc"] {
        let r = api(&a, "GET", &format!("/api/disks?{bad}"), None).await;
        assert_eq!(r.status, 400, "{bad}");
    }
    let r = api(&a, "DELETE", &format!("/api/disks/{second}"), None).await;
    assert_eq!((r.status, r.json()), (200, json!({"success": true})));
    assert!(!a.disk_dir(&second).exists());
    assert_eq!(api(&a, "GET", &format!("/api/disks/{second}"), None).await.status, 404);
    assert_eq!(
        api(&a, "DELETE", &format!("/api/disks/{second}"), None).await.status,
        404
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_answers_exit_codes_output_and_its_container_as_documented() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("work").unwrap();
    let d = exec1(
        &a,
        &disk,
        "pwd; cat; echo out; printf 'bad \\377 byte' >&2; echo \"$ARCHIL_DISK_ID $ARCHIL_REGION ${ARCHIL_CONTAINER_ID%%-*}\"; echo made > /mnt/archil/made.txt; exit 3",
    )
    .await;
    assert_eq!(d["exitCode"], 3);
    assert_eq!(d["stdout"], json!(format!("/\nout\n{disk} aws-us-east-1 ctr\n")));
    assert_eq!(d["stderr"], json!("bad \u{FFFD} byte"));
    for t in ["totalMs", "queueMs", "executeMs"] {
        assert!(d["timing"][t].is_u64(), "{t} in {d}");
    }
    assert!(d["timing"]["totalMs"].as_u64() >= d["timing"]["executeMs"].as_u64());
    assert_eq!(
        std::fs::read_to_string(a.disk_dir(&disk).join("made.txt")).unwrap(),
        "made\n"
    );
    // A fresh container each call: nothing of the last one's but the disk.
    let d = exec1(&a, &disk, "touch /tmp/mine; cat /mnt/archil/made.txt").await;
    assert_eq!(
        (d["exitCode"].clone(), d["stdout"].clone()),
        (json!(0), json!("made\n"))
    );
    let d = exec1(&a, &disk, "ls /tmp/mine 2>/dev/null || echo gone").await;
    assert_eq!(d["stdout"], "gone\n");
    let d = exec1(&a, &disk, "kill -9 $$").await;
    assert_eq!(d["exitCode"], 137);

    // Several disks, each at its relPath, a subdirectory and a read-only one.
    let other = a.create_disk("other").unwrap();
    // Made through the object API, as the boxes' own (a file this machine's root made
    // directly would be no box's to write).
    assert_eq!(
        s3(&a, "PUT", &format!("{other}/app/logs/l.txt"), b"log\n").await.status,
        200
    );
    let r = exec_many(
        &a,
        json!({
            "w": disk,
            "deep/logs": {"disk": other, "subdirectory": "app/logs"},
            "ro": {"disk": other, "readOnly": true},
        }),
        "cat /mnt/archil/deep/logs/l.txt /mnt/archil/ro/app/logs/l.txt /mnt/archil/w/made.txt; \
         echo x > /mnt/archil/deep/logs/new.txt; \
         echo y > /mnt/archil/ro/no.txt 2>/dev/null || echo refused; echo $ARCHIL_DISK_ID; ls /mnt/archil",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json()["data"].clone();
    assert_eq!(
        d["stdout"],
        json!(format!("log\nlog\nmade\nrefused\n{other}\ndeep\nro\nw\n")),
        "{d}"
    );
    assert!(a.disk_dir(&other).join("app/logs/new.txt").exists());
    assert!(!a.disk_dir(&other).join("no.txt").exists());

    // Refusals, each naming its field.
    let sub_missing = json!({"d": {"disk": other, "subdirectory": "nope"}});
    for (disks, status, says) in [
        (json!({}), 400, "at least one"),
        (json!({"": disk}), 400, "empty"),
        (json!({"/abs": disk}), 400, "absolute"),
        (json!({"a/../b": disk}), 400, ".."),
        (json!({"a/./b": disk}), 400, ".."),
        (json!({"a": disk, "a/b": other}), 400, "holds the other"),
        (json!({"d": "dsk-0000000000000000"}), 404, "not found"),
        (
            json!({"d": {"disk": other, "subdirectory": "../x"}}),
            400,
            "subdirectory",
        ),
        (
            json!({"d": {"disk": other, "subdirectory": "/app"}}),
            400,
            "subdirectory",
        ),
        (sub_missing, 404, "no such directory"),
        (
            json!({"d": {"disk": other, "subdirectory": "app/logs/l.txt"}}),
            400,
            "not a directory",
        ),
        (
            json!({"d": {"disk": other, "readOnly": true, "queueMs": 10}}),
            400,
            "readOnly",
        ),
        (
            json!({"d": {"disk": other, "readOnly": true, "checkoutPaths": ["a"]}}),
            400,
            "readOnly",
        ),
        (json!({"d": {"disk": other, "read_only": true}}), 400, "read_only"),
        (json!({"d": 5}), 400, "disks.d"),
    ] {
        let r = exec_many(&a, disks.clone(), "true").await;
        assert_eq!(r.status, status, "{disks}: {}", r.text());
        let e = r.json();
        assert_eq!(e["success"], false);
        assert!(e["error"].as_str().unwrap().contains(says), "{disks}: {e}");
    }
    let r = api(
        &a,
        "POST",
        &format!("/api/disks/{disk}/exec"),
        Some(&json!({"command": ""})),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = api(
        &a,
        "POST",
        "/api/disks/dsk-0000000000000000/exec",
        Some(&json!({"command": "true"})),
    )
    .await;
    assert_eq!((r.status, r.json()["code"].clone()), (404, json!("not_found")));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_the_limit_is_504_and_output_past_its_bound_is_refused() {
    let a = fake(|o| o.exec_limit = Duration::from_secs(2)).await;
    let disk = a.create_disk("slow").unwrap();
    let t0 = Instant::now();
    let r = api(
        &a,
        "POST",
        &format!("/api/disks/{disk}/exec"),
        Some(&json!({"command": "sleep 6; touch /mnt/archil/late"})),
    )
    .await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["code"], "timeout");
    assert_eq!(r.json()["success"], false);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!a.disk_dir(&disk).join("late").exists(), "the command outlived its 504");
    // The checkout went with it: the disk takes writes again.
    assert_eq!(s3(&a, "PUT", &format!("{disk}/after"), b"x").await.status, 200);
    // Output is bounded: past 64 MiB on one stream the call is refused, never grown.
    let r = api(
        &a,
        "POST",
        &format!("/api/disks/{disk}/exec"),
        Some(&json!({"command": "head -c 70000000 /dev/zero; touch /mnt/archil/after-output"})),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (400, json!("output_too_large")),
        "{}",
        r.text()
    );
    assert!(r.json()["error"].as_str().unwrap().contains("stdout"));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkouts_queue_in_order_time_out_and_hold_off_object_writes() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("shared").unwrap();
    assert_eq!(s3(&a, "PUT", &format!("{disk}/a/"), b"").await.status, 200);
    // One exec holds the whole disk for 2 s.
    let t0 = Instant::now();
    let hold = exec_many(&a, json!({"m": disk}), "sleep 2; echo first > /mnt/archil/m/first");
    let later = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // No queueMs: refused at once, 400 checkout_timeout (the openapi's 400 for a
        // delegation conflict).
        let now = exec_many(&a, json!({"m": {"disk": disk}}), "true").await;
        // Object writes under it are refused for a retry; reads go on.
        let put = s3(&a, "PUT", &format!("{disk}/a/x"), b"x").await;
        let get = s3(&a, "GET", &format!("{disk}?list-type=2"), b"").await;
        // A read-only or conditional mount takes no checkout.
        let ro = exec_many(&a, json!({"m": {"disk": disk, "readOnly": true}}), "echo ro").await;
        let cond = exec_many(&a, json!({"m": {"disk": disk, "conditional": true}}), "echo c").await;
        (now, put, get, ro, cond)
    };
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        exec_many(
            &a,
            json!({"m": {"disk": disk, "subdirectory": "a", "queueMs": 20000}}),
            "echo second >> /mnt/archil/m/order",
        )
        .await
    };
    let third = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        exec_many(
            &a,
            json!({"m": {"disk": disk, "queueMs": 20000}}),
            "echo third >> /mnt/archil/m/a/order",
        )
        .await
    };
    let (hold, (now, put, get, ro, cond), second, third) = tokio::join!(hold, later, second, third);
    assert_eq!(hold.status, 200, "{}", hold.text());
    assert_eq!(now.status, 400, "{}", now.text());
    assert_eq!(now.json()["code"], "checkout_timeout");
    assert!(now.json()["error"].as_str().unwrap().contains(&disk), "{}", now.text());
    assert_eq!((put.status, put.s3_code()), (409, "OperationAborted".to_string()));
    assert_eq!(get.status, 200);
    assert_eq!(ro.status, 200, "{}", ro.text());
    assert_eq!(cond.status, 200, "{}", cond.text());
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(third.status, 200, "{}", third.text());
    // The second waited for the first, the third for the second, in the order they came.
    assert_eq!(
        std::fs::read_to_string(a.disk_dir(&disk).join("a/order")).unwrap(),
        "second\nthird\n"
    );
    let waited = second.json()["data"]["timing"]["queueMs"].as_u64().unwrap();
    assert!(waited >= 1500, "the second's queueMs {waited}");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    // A wait that ends first gives up, with how long it waited.
    let hold = exec_many(&a, json!({"m": {"disk": disk, "checkoutPaths": ["a"]}}), "sleep 2");
    let give_up = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        let r = exec_many(
            &a,
            json!({"m": {"disk": disk, "subdirectory": "a", "queueMs": 500}}),
            "true",
        )
        .await;
        (r, t.elapsed())
    };
    let free = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Another path of the disk is free to write.
        (
            s3(&a, "PUT", &format!("{disk}/b/x"), b"x").await,
            s3(&a, "PUT", &format!("{disk}/a/x"), b"x").await,
        )
    };
    let (hold, (r, took), (free, held)) = tokio::join!(hold, give_up, free);
    assert_eq!(hold.status, 200);
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (400, json!("checkout_timeout")),
        "{}",
        r.text()
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1900),
        "{took:?}"
    );
    assert_eq!(free.status, 200);
    assert_eq!(held.status, 409);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_round_trip_every_byte_and_list_with_directories() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("objects").unwrap();
    let every: Vec<u8> = (0..=255u8).collect();
    let r = s3(&a, "PUT", &format!("{disk}/bytes/all.bin"), &every).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let etag = r.header("etag").unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let g = s3(&a, "GET", &format!("{disk}/bytes/all.bin"), b"").await;
    assert_eq!((g.status, g.body.clone()), (200, every.clone()));
    assert_eq!(g.header("etag"), Some(etag.as_str()));
    assert_eq!(std::fs::read(a.disk_dir(&disk).join("bytes/all.bin")).unwrap(), every);
    let h = s3(&a, "HEAD", &format!("{disk}/bytes/all.bin"), b"").await;
    assert_eq!((h.status, h.header("content-length")), (200, Some("256")));
    assert_eq!(h.header("etag"), Some(etag.as_str()));
    assert!(h.header("last-modified").unwrap().ends_with(" GMT"));
    // Escaped names, as the SDK's quote() sends them.
    let r = s3(&a, "PUT", &format!("{disk}/sp%20ace/%C3%A9%3F%23%25"), b"odd").await;
    assert_eq!(r.status, 200);
    assert_eq!(std::fs::read(a.disk_dir(&disk).join("sp ace/é?#%")).unwrap(), b"odd");
    // Missing, and a directory: NoSuchKey; HEAD 404 with no body.
    for k in ["nope", "bytes", "bytes/"] {
        let r = s3(&a, "GET", &format!("{disk}/{k}"), b"").await;
        assert_eq!((r.status, r.s3_code()), (404, "NoSuchKey".to_string()), "{k}");
    }
    let r = s3(&a, "HEAD", &format!("{disk}/nope"), b"").await;
    assert_eq!((r.status, r.body.len()), (404, 0));
    // Mode honoured; uid and gid accepted.
    let r = raw(
        &a,
        Some(&auth()),
        "PUT",
        &format!("/s3/{disk}/modes/x.sh"),
        &[
            ("x-archil-mode", "750"),
            ("x-archil-uid", "1000"),
            ("x-archil-gid", "1000"),
        ],
        b"#!/bin/sh\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mode = std::fs::metadata(a.disk_dir(&disk).join("modes/x.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
    let r = raw(
        &a,
        Some(&auth()),
        "PUT",
        &format!("/s3/{disk}/m"),
        &[("x-archil-mode", "9")],
        b"",
    )
    .await;
    assert_eq!((r.status, r.s3_code()), (400, "InvalidArgument".to_string()));
    // Directories: made by a key ending in /, empty ones listed too.
    assert_eq!(s3(&a, "PUT", &format!("{disk}/empty/"), b"").await.status, 200);
    assert!(a.disk_dir(&disk).join("empty").is_dir());
    assert_eq!(s3(&a, "PUT", &format!("{disk}/empty/"), b"x").await.status, 400);
    // Append: made, then grown; more than 1 MiB refused.
    for part in ["one,", "two"] {
        let r = s3(&a, "PUT", &format!("{disk}/log.txt?append=true"), part.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.header("etag").is_some());
    }
    assert_eq!(s3(&a, "GET", &format!("{disk}/log.txt"), b"").await.body, b"one,two");
    let big = vec![b'x'; (1 << 20) + 1];
    let r = s3(&a, "PUT", &format!("{disk}/log.txt?append=true"), &big).await;
    assert_eq!((r.status, r.s3_code()), (400, "EntityTooLarge".to_string()));
    // A PUT over the bound is refused from its Content-Length, before its body.
    let r = http::request_never_sending_its_body(
        a.addr(),
        "PUT",
        &format!("/s3/{disk}/huge"),
        &[
            ("authorization", &auth()),
            ("content-length", &(513u64 << 20).to_string()),
        ],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!((r.status, r.s3_code()), (400, "EntityTooLarge".to_string()));
    assert!(!a.disk_dir(&disk).join("huge").exists());

    // One level with the delimiter: files, and directories as CommonPrefixes.
    let l = s3(&a, "GET", &format!("{disk}?list-type=2&delimiter=%2F"), b"").await;
    assert_eq!(l.status, 200, "{}", l.text());
    let t = l.text();
    assert_eq!(all(&t, "<Key>", "</Key>"), vec!["log.txt"]);
    assert_eq!(
        all(&t, "<CommonPrefixes><Prefix>", "</Prefix>"),
        vec!["bytes/", "empty/", "modes/", "sp ace/"]
    );
    assert_eq!(between(&t, "<KeyCount>", "</KeyCount>").as_deref(), Some("5"));
    assert_eq!(between(&t, "<IsTruncated>", "</IsTruncated>").as_deref(), Some("false"));
    assert_eq!(between(&t, "<Size>", "</Size>").as_deref(), Some("7"));
    // Under a prefix, and everything without the delimiter (files only), in key order.
    let l = s3(&a, "GET", &format!("{disk}?list-type=2&delimiter=/&prefix=bytes/"), b"").await;
    assert_eq!(all(&l.text(), "<Key>", "</Key>"), vec!["bytes/all.bin"]);
    let l = s3(&a, "GET", &format!("{disk}?list-type=2"), b"").await;
    let keys = vec!["bytes/all.bin", "log.txt", "modes/x.sh", "sp ace/é?#%"];
    assert_eq!(all(&l.text(), "<Key>", "</Key>"), keys);
    // Pages of one, by continuation token, and start-after.
    let mut got = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let path = match &token {
            Some(t) => format!("{disk}?list-type=2&max-keys=1&continuation-token={t}"),
            None => format!("{disk}?list-type=2&max-keys=1"),
        };
        let t = s3(&a, "GET", &path, b"").await.text();
        got.extend(all(&t, "<Key>", "</Key>"));
        match between(&t, "<NextContinuationToken>", "</NextContinuationToken>") {
            Some(n) => {
                assert_eq!(between(&t, "<IsTruncated>", "</IsTruncated>").as_deref(), Some("true"));
                token = Some(n);
            }
            None => break,
        }
    }
    assert_eq!(got, keys);
    let l = s3(&a, "GET", &format!("{disk}?list-type=2&start-after=log.txt"), b"").await;
    assert_eq!(all(&l.text(), "<Key>", "</Key>"), vec!["modes/x.sh", "sp ace/é?#%"]);
    for bad in [
        "list-type=2&delimiter=-",
        "list-type=2&encoding-type=url",
        "prefix=a",
        "list-type=2&continuation-token=zz",
    ] {
        let r = s3(&a, "GET", &format!("{disk}?{bad}"), b"").await;
        assert_eq!((r.status, r.s3_code()), (400, "InvalidArgument".to_string()), "{bad}");
    }

    // Deletes: a file, one already gone, a directory only once empty.
    assert_eq!(s3(&a, "DELETE", &format!("{disk}/log.txt"), b"").await.status, 204);
    assert_eq!(s3(&a, "DELETE", &format!("{disk}/log.txt"), b"").await.status, 204);
    let r = s3(&a, "DELETE", &format!("{disk}/bytes/"), b"").await;
    assert_eq!((r.status, r.s3_code()), (409, "DirectoryNotEmpty".to_string()));
    assert_eq!(s3(&a, "DELETE", &format!("{disk}/empty/"), b"").await.status, 204);
    assert!(!a.disk_dir(&disk).join("empty").exists());
    // DeleteObjects as the SDK writes it, one key refused in its own <Error>.
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Delete><Object><Key>bytes/all.bin</Key></Object><Object><Key>sp ace/é?#%</Key></Object><Object><Key>../x</Key></Object><Object><Key>never</Key></Object></Delete>";
    let r = s3(&a, "POST", &format!("{disk}?delete"), body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.text();
    assert_eq!(
        all(&t, "<Deleted><Key>", "</Key>"),
        vec!["bytes/all.bin", "sp ace/é?#%", "never"]
    );
    assert_eq!(all(&t, "<Error><Key>", "</Key>"), vec!["../x"]);
    assert!(!a.disk_dir(&disk).join("bytes/all.bin").exists());
    let r = s3(&a, "POST", &format!("{disk}?delete"), b"<Delete>").await;
    assert_eq!((r.status, r.s3_code()), (400, "MalformedXML".to_string()));
    // Multipart is not served; a disk that is not there is NoSuchBucket.
    let r = s3(&a, "POST", &format!("{disk}/big?uploads"), b"").await;
    assert_eq!((r.status, r.s3_code()), (501, "NotImplemented".to_string()));
    let r = s3(&a, "GET", "dsk-0000000000000000/x", b"").await;
    assert_eq!((r.status, r.s3_code()), (404, "NoSuchBucket".to_string()));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_or_link_leads_out_of_its_disk() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("jail").unwrap();
    let other = a.create_disk("neighbour").unwrap();
    std::fs::write(a.disk_dir(&other).join("secret"), "theirs").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("host.txt"), "host").unwrap();
    for (key, why) in [
        ("..", "a `..` segment"),
        ("../neighbour", "a `..` segment"),
        ("a/../../x", "a `..` segment"),
        ("%2E%2E/x", "encoded `..`"),
        ("a/%2e%2e/%2e%2e/x", "encoded `..`"),
        ("/etc/passwd", "a leading / (an empty segment)"),
        ("a//b", "an empty segment"),
        ("a%00b", "a NUL"),
        ("./a", "a `.` segment"),
    ] {
        for m in ["GET", "PUT", "DELETE"] {
            let r = s3(&a, m, &format!("{disk}/{key}"), b"x").await;
            assert_eq!(
                (r.status, r.s3_code()),
                (400, "InvalidArgument".to_string()),
                "{m} {key}: {why}"
            );
        }
    }
    let r = s3(&a, "GET", &format!("{disk}/{}", "k".repeat(1025)), b"").await;
    assert_eq!((r.status, r.s3_code()), (400, "KeyTooLongError".to_string()));
    // Links a box could leave: out of the disk (absolute, relative, to the neighbour), and
    // one that stays inside, which is followed.
    let dir = a.disk_dir(&disk);
    std::os::unix::fs::symlink(outside.path(), dir.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../", dir.join("up")).unwrap();
    std::os::unix::fs::symlink(format!("../{other}"), dir.join("next")).unwrap();
    std::fs::create_dir(dir.join("real")).unwrap();
    std::fs::write(dir.join("real/in.txt"), "inside").unwrap();
    std::os::unix::fs::symlink("real", dir.join("alias")).unwrap();
    for key in ["abs/host.txt", "next/secret", "up/etc/passwd"] {
        let r = s3(&a, "GET", &format!("{disk}/{key}"), b"").await;
        assert_eq!((r.status, r.s3_code()), (403, "AccessDenied".to_string()), "GET {key}");
        let r = s3(&a, "PUT", &format!("{disk}/{key}"), b"overwritten").await;
        assert_eq!((r.status, r.s3_code()), (403, "AccessDenied".to_string()), "PUT {key}");
        let r = s3(&a, "PUT", &format!("{disk}/{key}?append=true"), b"more").await;
        assert_eq!(r.status, 403, "append {key}");
    }
    let r = s3(&a, "DELETE", &format!("{disk}/abs/host.txt"), b"").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("host.txt")).unwrap(),
        "host"
    );
    assert_eq!(
        std::fs::read_to_string(a.disk_dir(&other).join("secret")).unwrap(),
        "theirs"
    );
    assert_eq!(
        s3(&a, "GET", &format!("{disk}/alias/in.txt"), b"").await.body,
        b"inside"
    );
    // Deleting the link itself removes the link, not what it names.
    assert_eq!(s3(&a, "DELETE", &format!("{disk}/abs"), b"").await.status, 204);
    assert!(outside.path().join("host.txt").exists());
    // A listing leaves links out; an exec's subdirectory through one is refused.
    let l = s3(&a, "GET", &format!("{disk}?list-type=2&delimiter=/"), b"").await;
    assert_eq!(all(&l.text(), "<CommonPrefixes><Prefix>", "</Prefix>"), vec!["real/"]);
    let r = exec_many(
        &a,
        json!({"x": {"disk": disk, "subdirectory": "next"}}),
        "cat /mnt/archil/x/secret",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = exec_many(
        &a,
        json!({"x": {"disk": disk, "subdirectory": "alias"}}),
        "cat /mnt/archil/x/in.txt",
    )
    .await;
    assert_eq!((r.status, r.json()["data"]["stdout"].clone()), (200, json!("inside")));
    a.shutdown().await;
}

/// Whether `p` is a symbolic link naming `to`.
fn is_link_to(p: &std::path::Path, to: &str) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
        && std::fs::read_link(p).is_ok_and(|t| t == std::path::Path::new(to))
}

/// The names in `dir` the fake is still writing (none once a write answered).
fn temps_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".archil-put-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_follow_a_link_at_the_leaf_within_the_disk_as_a_file_write_does() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("links").unwrap();
    let other = a.create_disk("beside").unwrap();
    std::fs::write(a.disk_dir(&other).join("secret"), "theirs").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("host.txt"), "host").unwrap();
    let host = outside.path().join("host.txt").to_string_lossy().into_owned();
    // Links as a box leaves them (made in one, so they are its own).
    let d = exec1(
        &a,
        &disk,
        &format!(
            "cd /mnt/archil && mkdir d sub && printf old > f && ln -s f to-file && ln -s to-file chain \
             && ln -s ../f sub/up && ln -s d to-dir && ln -s . to-self && ln -s d/ to-dir-slash \
             && ln -s missing dangling && ln -s missing2 dangling2 && ln -s nowhere/x dangling-deep \
             && ln -s loop loop && ln -s '{host}' out-abs && ln -s ../{other}/secret out-rel \
             && ln -s ../{other}/new out-dangling && ln -s sub/../.. out-up"
        ),
    )
    .await;
    assert_eq!(d["exitCode"], 0, "{d}");
    let dir = a.disk_dir(&disk);
    let put = |key: &str, body: &'static [u8]| {
        let (a, path) = (&a, format!("{disk}/{key}"));
        async move { s3(a, "PUT", &path, body).await }
    };

    // Through a link to a file (and a chain of them, and one whose `..` stays inside): the
    // file is written, the link kept, and a read through the link sees the new bytes.
    for (key, body) in [("to-file", &b"new"[..]), ("chain", b"again"), ("sub/up", b"up")] {
        let r = put(key, body).await;
        assert_eq!(r.status, 200, "PUT {key}: {}", r.text());
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), body, "PUT {key}");
        let g = s3(&a, "GET", &format!("{disk}/{key}"), b"").await;
        assert_eq!((g.status, g.body), (200, body.to_vec()), "GET {key}");
    }
    assert!(is_link_to(&dir.join("to-file"), "f"));
    assert!(is_link_to(&dir.join("chain"), "to-file"));
    assert!(is_link_to(&dir.join("sub/up"), "../f"));
    let r = s3(&a, "PUT", &format!("{disk}/to-file?append=true"), b"+").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"up+");
    assert!(is_link_to(&dir.join("to-file"), "f"));

    // Through a link to a directory: refused as a directory of the key's name is (what
    // open(2) answers EISDIR), the directory and the link left as they were.
    for key in ["to-dir", "to-self", "to-dir-slash", "to-dir?append=true"] {
        let r = put(key, b"x").await;
        assert_eq!(
            (r.status, r.s3_code()),
            (400, "InvalidRequest".to_string()),
            "PUT {key}"
        );
        assert!(r.text().contains("a directory of that name is there"), "{}", r.text());
    }
    assert!(dir.join("d").is_dir() && std::fs::read_dir(dir.join("d")).unwrap().next().is_none());
    assert!(is_link_to(&dir.join("to-dir"), "d"));
    assert!(is_link_to(&dir.join("to-self"), "."));

    // Through a dangling link: the file is made where it points (the boxes' to change), the
    // link kept; one whose directory is missing is NoSuchKey and makes nothing.
    let r = put("dangling", b"made").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::read(dir.join("missing")).unwrap(), b"made");
    assert!(is_link_to(&dir.join("dangling"), "missing"));
    let r = s3(&a, "PUT", &format!("{disk}/dangling2?append=true"), b"grown").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::read(dir.join("missing2")).unwrap(), b"grown");
    assert!(is_link_to(&dir.join("dangling2"), "missing2"));
    let d = exec1(
        &a,
        &disk,
        "cd /mnt/archil && printf , >> dangling && cat missing && printf ! >> missing2 && cat missing2",
    )
    .await;
    assert_eq!(
        (d["exitCode"].clone(), d["stdout"].clone()),
        (json!(0), json!("made,grown!")),
        "{d}"
    );
    for key in ["dangling-deep", "dangling-deep?append=true"] {
        let r = put(key, b"x").await;
        assert_eq!((r.status, r.s3_code()), (404, "NoSuchKey".to_string()), "PUT {key}");
    }
    assert!(!dir.join("nowhere").exists());

    // A loop: InvalidRequest (open(2)'s ELOOP), nothing made.
    for key in ["loop", "loop?append=true"] {
        let r = put(key, b"x").await;
        assert_eq!(
            (r.status, r.s3_code()),
            (400, "InvalidRequest".to_string()),
            "PUT {key}"
        );
    }
    assert!(is_link_to(&dir.join("loop"), "loop"));

    // Out of the disk (absolute, to the neighbour, dangling there, `..` past the root):
    // AccessDenied, and nothing outside written or made.
    for key in ["out-abs", "out-rel", "out-dangling", "out-up"] {
        for q in ["", "?append=true"] {
            let r = put(&format!("{key}{q}"), b"overwritten").await;
            assert_eq!(
                (r.status, r.s3_code()),
                (403, "AccessDenied".to_string()),
                "PUT {key}{q}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "host");
    assert_eq!(
        std::fs::read_to_string(a.disk_dir(&other).join("secret")).unwrap(),
        "theirs"
    );
    assert!(!a.disk_dir(&other).join("new").exists());
    assert!(is_link_to(&dir.join("out-rel"), &format!("../{other}/secret")));
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    for d in [&dir, &dir.join("sub"), &dir.join("d")] {
        assert_eq!(temps_in(d), Vec::<String>::new(), "{}", d.display());
    }
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_errors_answer_in_each_apis_envelope_and_requests_are_recorded() {
    let a = fake(|_| {}).await;
    let disk = a.create_disk("faults").unwrap();
    a.fail_next("GET", "/api/disks", 503, "no_capacity", "scripted busy", 2);
    a.fail_next("*", &format!("/s3/{disk}/k"), 500, "InternalError", "scripted s3", 1);
    for _ in 0..2 {
        let r = api(&a, "GET", "/api/disks", None).await;
        assert_eq!(r.status, 503);
        assert_eq!(
            r.json(),
            json!({"success": false, "error": "scripted busy", "code": "no_capacity"})
        );
    }
    assert_eq!(api(&a, "GET", "/api/disks", None).await.status, 200);
    // The S3 fault matches its path alone: the PUT to another key passes.
    assert_eq!(s3(&a, "PUT", &format!("{disk}/other"), b"v").await.status, 200);
    let r = s3(&a, "PUT", &format!("{disk}/k"), b"v").await;
    assert_eq!((r.status, r.s3_code()), (500, "InternalError".to_string()));
    assert!(r.text().contains("<Message>scripted s3</Message>"));
    assert_eq!(s3(&a, "PUT", &format!("{disk}/k"), b"v").await.status, 200);
    // A fault on exec answers before any container is made.
    a.fail_next("POST", "/api/exec", 504, "timeout", "scripted timeout", 1);
    let r = exec_many(&a, json!({"m": disk}), "touch /mnt/archil/ran").await;
    assert_eq!((r.status, r.json()["code"].clone()), (504, json!("timeout")));
    assert!(!a.disk_dir(&disk).join("ran").exists());
    let _ = raw(&a, Some("key-wrong"), "GET", "/api/disks?name=x", &[], b"").await;
    let log = a.requests();
    assert!(
        log.iter()
            .any(|r| r.method == "POST" && r.path == "/api/exec" && r.body.contains("touch /mnt/archil/ran")),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|r| r.method == "PUT" && r.path == format!("/s3/{disk}/k") && r.body == "v")
    );
    assert!(log.iter().any(|r| r.path == "/api/disks?name=x"));
    assert!(
        !log.iter().any(|r| r.body.contains(KEY) || r.path.contains(KEY)),
        "the key was recorded: {log:?}"
    );
    a.shutdown().await;
}
