//! A directory in and out of a box as a tar: unpacked by the safe extractor whichever side
//! made it (a link, a path that climbs, a device never land), a malformed archive leaving the
//! box as it was, and another key's box unreachable.

mod support;

use std::sync::Arc;

use agentbox_server::Keys;
use serde_json::json;
use support::*;

/// A tar of `members` (path, bytes), a link `evil -> /etc/passwd`, and a member whose name
/// climbs out (`../escape.txt`), written header by header as a hostile client would.
fn hostile_tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, *bytes).unwrap();
    }
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    link.set_path("evil").unwrap();
    link.set_link_name("/etc/passwd").unwrap();
    link.set_cksum();
    b.append(&link, &[][..]).unwrap();
    let mut climb = tar::Header::new_gnu();
    climb.set_size(3);
    climb.set_mode(0o644);
    let name = b"../escape.txt";
    climb.as_old_mut().name[..name.len()].copy_from_slice(name);
    climb.set_cksum();
    b.append(&climb, &b"bad"[..]).unwrap();
    b.into_inner().unwrap()
}

async fn put(s: &Server, key: &str, id: &str, path: &str, tar: Vec<u8>) -> (u16, serde_json::Value) {
    let r = s
        .http
        .put(format!("{}/v1/boxes/{id}/archive?path={path}", s.url))
        .bearer_auth(key)
        .header("content-type", "application/x-tar")
        .body(tar)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_goes_in_and_out_as_a_tar_and_nothing_hostile_lands() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let (_, other) = keys.add("other", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let (st, b) = call(
        &s,
        Some(&key),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{b}");
    let id = b["id"].as_str().unwrap().to_string();

    let tar = hostile_tar(&[("a.txt", b"alpha"), ("sub/b.txt", b"beta")]);
    let (st, got) = put(&s, &key, &id, "in/dir", tar.clone()).await;
    assert_eq!(st, 200, "{got}");
    assert_eq!(got["skipped"]["symlink"], 1, "{got}");
    assert_eq!(
        got["skipped"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        2,
        "{got}"
    );
    assert!(
        got["skips"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == "../escape.txt"),
        "{got}"
    );
    let listed = run_in(
        &s,
        &key,
        &id,
        "cd in && find . | sort && cat dir/a.txt dir/sub/b.txt && \
         { [ -e ../escape.txt ] || [ -e escape.txt ] || [ -e dir/escape.txt ]; } && echo landed || echo none",
    )
    .await;
    assert_eq!(
        listed, ".\n./dir\n./dir/a.txt\n./dir/sub\n./dir/sub/b.txt\nalphabetanone\n",
        "{listed}"
    );

    // Out again, with a link the box made beside them: left out, and said.
    run_in(&s, &key, &id, "ln -s /etc/passwd in/dir/link").await;
    let r = s
        .http
        .get(format!("{}/v1/boxes/{id}/archive?path=in/dir", s.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    assert_eq!(r.headers()["agentbox-skipped"], "symlink=1");
    let bytes = r.bytes().await.unwrap();
    let members = members_of(&bytes);
    let want = [("a.txt", "alpha"), ("sub/", ""), ("sub/b.txt", "beta")];
    let want: Vec<(String, String)> = want.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
    assert_eq!(members, want);

    // A malformed archive leaves the box as it was.
    let mut cut = tar.clone();
    cut[148] ^= 0x55; // the first header's checksum
    let (st, b) = put(&s, &key, &id, "other", cut).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    assert_eq!(run_in(&s, &key, &id, "ls -d other 2>/dev/null | wc -l").await, "0\n");

    // A path that climbs, a directory that is not there, another key's box.
    let (st, b) = put(&s, &key, &id, "../up", tar.clone()).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    let (st, b) = call(
        &s,
        Some(&key),
        "GET",
        &format!("/v1/boxes/{id}/archive?path=nowhere"),
        None,
    )
    .await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    let (st, b) = put(&s, &other, &id, "x", tar).await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    let (st, b) = call(
        &s,
        Some(&other),
        "GET",
        &format!("/v1/boxes/{id}/archive?path=in"),
        None,
    )
    .await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
}

/// The members of a tar, as (path, text), sorted.
fn members_of(bytes: &[u8]) -> Vec<(String, String)> {
    let mut members: Vec<(String, String)> = tar::Archive::new(bytes)
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            (e.path().unwrap().display().to_string(), text)
        })
        .collect();
    members.sort();
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_and_a_pick_bring_out_only_what_changed() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let (_, other) = keys.add("other", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let (st, b) = call(
        &s,
        Some(&key),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    run_in(
        &s,
        &key,
        &id,
        "mkdir -p w/sub && printf one > w/a.txt && printf two > w/sub/b.txt && ln -s /etc/passwd w/link",
    )
    .await;

    let (st, listed) = call(
        &s,
        Some(&key),
        "GET",
        &format!("/v1/boxes/{id}/archive/listing?path=w"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{listed}");
    let e = &listed["entries"];
    assert_eq!(
        (e["a.txt"]["kind"].as_str(), e["a.txt"]["size"].as_u64()),
        (Some("f"), Some(3))
    );
    assert_eq!(e["sub"]["kind"], "d");
    assert_eq!(e["link"]["kind"], "l", "a link is listed, not followed: {listed}");
    assert!(e["sub/b.txt"]["mtime"].as_str().unwrap().contains('.'), "{listed}");

    // Only the files named come out; a link named is left out, as is what was not named.
    let pick = |names: serde_json::Value| {
        s.http
            .post(format!("{}/v1/boxes/{id}/archive/pick", s.url))
            .bearer_auth(&key)
            .json(&json!({"path": "w", "names": names}))
            .send()
    };
    let r = pick(json!(["sub/b.txt", "link"])).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let got = members_of(&r.bytes().await.unwrap());
    assert_eq!(
        got,
        vec![
            ("sub/".to_string(), String::new()),
            ("sub/b.txt".to_string(), "two".to_string())
        ]
    );

    // A name that climbs is refused, naming which; another key's box is not found.
    let r = pick(json!(["a.txt", "../etc/passwd"])).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(code_of(&b), "invalid");
    assert!(b["message"].as_str().unwrap().starts_with("names[1]"), "{b}");
    let (st, b) = call(
        &s,
        Some(&other),
        "GET",
        &format!("/v1/boxes/{id}/archive/listing?path=w"),
        None,
    )
    .await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
}
