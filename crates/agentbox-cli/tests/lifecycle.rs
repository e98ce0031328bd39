//! The lifecycle commands, run as a person would: `box open`, `sleep`, `wake`, `extend`,
//! `snapshot`, `snapshots`, `create --from-snapshot`, `fork`, `discard`, on local boxes.

mod common;

use common::Home;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Home {
    fn cat(&self, id: &str, path: &str) -> String {
        self.ok(&[
            "box",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            &format!("cat {path} 2>/dev/null || echo absent"),
        ])
        .trim()
        .to_string()
    }

    fn put(&self, id: &str, path: &str, text: &str) {
        self.ok(&[
            "box",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            &format!("printf %s '{text}' > {path}"),
        ]);
    }

    fn facts(&self, id: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["box", "facts", id])).unwrap()
    }
}

#[test]
fn a_box_opened_by_name_is_kept_slept_woken_extended_and_discarded() {
    let h = Home::new();
    let open = ["box", "open", "dev", "--provider", "local", "--lifetime", "5m"];
    let id = h.ok(&open).trim().to_string();
    assert!(id.starts_with("local:dev-"), "{id}");
    assert_eq!(h.facts(&id)["name"], "dev");
    h.put(&id, "kept", "one");
    assert_eq!(h.ok(&open).trim(), id, "opened again, the same box");

    assert_eq!(h.ok(&["box", "sleep", &id]).trim(), id);
    let out = h.run(&["box", "exec", &id, "--", "true"], b"");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("sleeps"), "{}", text(&out.stderr));
    let listed: serde_json::Value =
        serde_json::from_str(&h.ok(&["box", "ls", "--provider", "local", "--json"])).unwrap();
    assert!(
        listed.as_array().unwrap().iter().any(|b| b["id"] == id.as_str()),
        "{listed}"
    );
    assert_eq!(h.ok(&["box", "wake", &id]).trim(), id);
    assert_eq!(h.cat(&id, "kept"), "one");
    // Open wakes a sleeping box too.
    h.ok(&["box", "sleep", &id]);
    assert_eq!(h.ok(&open).trim(), id);
    assert_eq!(h.cat(&id, "kept"), "one");

    let before = h.facts(&id)["ends_at_ms"].as_u64().unwrap();
    let printed = h.ok(&["box", "extend", &id, "--by", "30m"]);
    let after = h.facts(&id)["ends_at_ms"].as_u64().unwrap();
    assert_eq!(after, before + 30 * 60 * 1000, "extended by 30m: {printed}");
    assert!(printed.trim().ends_with('Z'), "the new deadline as a time: {printed}");
    let out = h.run(&["box", "extend", &id], b"");
    assert_eq!(out.status.code(), Some(2), "no --by or --in: {}", text(&out.stderr));

    assert_eq!(h.ok(&["box", "discard", "dev", "--provider", "local"]).trim(), "dev");
    let out = h.run(&["box", "discard", "dev", "--provider", "local"], b"");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no local box is named \"dev\""),
        "{}",
        text(&out.stderr)
    );
    let again = h.ok(&open).trim().to_string();
    assert_eq!(h.cat(&again, "kept"), "absent", "discarded, its files went with it");
    h.ok(&["box", "rm", &again]);

    let out = h.run(&["box", "open", "Not_A_Name", "--provider", "local"], b"");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not a name"), "{}", text(&out.stderr));
}

#[test]
fn snapshots_are_taken_listed_made_from_and_deleted_and_forks_diverge() {
    let h = Home::new();
    let id = h
        .ok(&["box", "create", "--provider", "local", "--lifetime", "5m"])
        .trim()
        .to_string();
    h.put(&id, "kept", "parent");
    assert_eq!(h.ok(&["box", "snapshot", &id, "base"]).trim(), "base");
    let out = h.run(&["box", "snapshot", &id, "base"], b"");
    assert!(
        !out.status.success() && text(&out.stderr).contains("exists"),
        "{}",
        text(&out.stderr)
    );
    let listed = h.ok(&["box", "snapshots", "--provider", "local"]);
    assert!(
        listed.lines().any(|l| l.starts_with("base\t") && l.contains(&id)),
        "{listed}"
    );

    let made = h
        .ok(&["box", "create", "--provider", "local", "--from-snapshot", "base"])
        .trim()
        .to_string();
    assert_eq!(h.cat(&made, "kept"), "parent");
    assert_eq!(h.facts(&made)["snapshot"], "base");

    let kids = h.ok(&["box", "fork", &id, "-n", "3"]);
    let kids: Vec<&str> = kids.lines().collect();
    assert_eq!(kids.len(), 3, "{kids:?}");
    h.put(kids[0], "kept", "child");
    assert_eq!(h.cat(kids[1], "kept"), "parent");
    assert_eq!(h.cat(&id, "kept"), "parent");

    assert_eq!(
        h.ok(&["box", "snapshots", "--provider", "local", "--delete", "base"])
            .trim(),
        "base"
    );
    let out = h.run(
        &["box", "create", "--provider", "local", "--from-snapshot", "base"],
        b"",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no local snapshot named"),
        "{}",
        text(&out.stderr)
    );
    let mut all = vec!["box", "rm", &id, &made];
    all.extend(kids.iter().copied());
    h.ok(&all);
}
