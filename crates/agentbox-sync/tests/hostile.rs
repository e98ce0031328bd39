//! The hostile corpus: every way an archive may try to escape, lie or exhaust.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agentbox_sync::{Options, Receipt, SkipReason, StopReason, extract};
use common::*;

fn run(bytes: &[u8], dest: &Path) -> Receipt {
    extract(bytes, dest, &Options::default())
}

fn stopped(r: &Receipt) -> Option<StopReason> {
    r.stopped.as_ref().map(|s| s.reason)
}

/// Every path under `root`, for checking nothing else was made.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            }
        }
    }
    walk(root, root, &mut out);
    out.sort();
    out
}

#[test]
fn files_and_directories_are_written_with_capped_modes() {
    let d = tempfile::tempdir().unwrap();
    let a = archive(&[
        dir("top/"),
        member("top/run.sh", b'0', b"#!/bin/sh\n", 0o4777),
        member("top/shared", b'0', b"x", 0o666),
        file("top/plain.txt", b"hello"),
        member("contiguous", b'7', b"c", 0o600),
    ]);
    let r = run(&a, d.path());
    assert_eq!(r.stopped, None);
    assert_eq!((r.written, r.masked, r.skipped_total()), (5, 2, 0));
    let mode = |p: &str| std::fs::metadata(d.path().join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        (
            mode("top/run.sh"),
            mode("top/shared"),
            mode("top/plain.txt"),
            mode("contiguous")
        ),
        (0o755, 0o644, 0o644, 0o644)
    );
    assert_eq!(std::fs::read(d.path().join("top/plain.txt")).unwrap(), b"hello");
}

#[test]
fn unsafe_names_are_skipped() {
    let d = tempfile::tempdir().unwrap();
    let long_seg = "s".repeat(256);
    let long_path = vec!["p"; 2100].join("/");
    let a = archive(&[
        file("/etc/evil", b"x"),
        file("../evil", b"x"),
        file("a/../../evil", b"x"),
        file("a/./dot", b"x"),
        file("a//b", b"x"),
        pax(b'x', &[("path", b"nul\0name")]),
        file("placeholder1", b"x"),
        pax(b'x', &[("path", long_seg.as_bytes())]),
        file("placeholder2", b"x"),
        pax(b'x', &[("path", long_path.as_bytes())]),
        file("placeholder3", b"x"),
        file("fine", b"ok"),
    ]);
    let r = run(&a, d.path());
    assert_eq!(r.stopped, None, "{r:?}");
    assert_eq!(r.skipped[&SkipReason::UnsafeName], 8, "{r:?}");
    assert_eq!(tree(d.path()), vec!["fine"]);
}

#[test]
fn links_devices_and_fifos_are_never_created() {
    let d = tempfile::tempdir().unwrap();
    let a = archive(&[
        link("sym", b'2', "/etc/passwd"),
        link("hard", b'1', "fine"),
        link("dev", b'3', ""),
        link("blk", b'4', ""),
        link("pipe", b'6', ""),
        file("fine", b"x"),
    ]);
    let r = run(&a, d.path());
    assert_eq!(
        (
            r.written,
            r.skipped[&SkipReason::Symlink],
            r.skipped[&SkipReason::Hardlink],
            r.skipped[&SkipReason::Device],
            r.skipped[&SkipReason::Fifo]
        ),
        (1, 1, 1, 2, 1)
    );
    assert_eq!(r.skips[0].target.as_deref(), Some("/etc/passwd"));
    assert_eq!(tree(d.path()), vec!["fine"]);
}

#[test]
fn links_already_in_the_destination_are_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), d.path().join("evil")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("target"), d.path().join("f")).unwrap();
    let a = archive(&[
        file("evil/x", b"escape"),
        dir("evil/"),
        file("f", b"over a link"),
        file("ok", b"1"),
    ]);
    let r = run(&a, d.path());
    assert_eq!(r.stopped, None);
    assert_eq!(r.skipped[&SkipReason::LinkInDestination], 3, "{r:?}");
    assert!(
        tree(outside.path()).is_empty(),
        "nothing written outside: {:?}",
        tree(outside.path())
    );
    assert!(
        std::fs::symlink_metadata(d.path().join("f"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn a_file_never_replaces_a_directory_nor_the_other_way_round() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("d")).unwrap();
    std::fs::write(d.path().join("f"), b"keep").unwrap();
    let a = archive(&[file("d", b"x"), dir("f/"), file("f/inner", b"x")]);
    let r = run(&a, d.path());
    assert_eq!(r.skipped[&SkipReason::Occupied], 3, "{r:?}");
    assert!(d.path().join("d").is_dir());
    assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"keep");
}

#[test]
fn a_second_member_of_a_path_and_global_headers_are_skipped() {
    let d = tempfile::tempdir().unwrap();
    let a = archive(&[
        pax(b'g', &[("path", b"hijack")]),
        file("same", b"first"),
        file("same", b"second"),
        file("other", b"x"),
    ]);
    let r = run(&a, d.path());
    assert_eq!(
        (r.skipped[&SkipReason::Duplicate], r.skipped[&SkipReason::PaxGlobal]),
        (1, 1)
    );
    assert_eq!(std::fs::read(d.path().join("same")).unwrap(), b"first");
    assert_eq!(tree(d.path()), vec!["other", "same"]);
}

#[test]
fn gnu_long_names_and_pax_paths_are_applied() {
    let d = tempfile::tempdir().unwrap();
    let long = format!("deep/{}/file.txt", "n".repeat(150));
    let mut l = header(b"././@LongLink", b'L', long.len() as u64 + 1, 0o644, b"").to_vec();
    let mut payload = long.as_bytes().to_vec();
    payload.push(0);
    l.extend(padded(&payload));
    let a = archive(&[
        dir("deep/"),
        l,
        file("ignored-short-name", b"L"),
        pax(b'x', &[("path", b"via-pax.txt"), ("size", b"1")]),
        file("short", b"P"),
    ]);
    let r = run(&a, d.path());
    assert_eq!(r.stopped, None, "{r:?}");
    assert_eq!(std::fs::read(d.path().join(&long)).unwrap(), b"L");
    assert_eq!(std::fs::read(d.path().join("via-pax.txt")).unwrap(), b"P");
}

#[test]
fn malformed_archives_stop_cleanly_and_what_was_written_stays_whole() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad checksum", {
            let mut bad = file("b", b"x");
            bad[148] = b'7';
            [file("a", b"kept"), bad, end()].concat()
        }),
        (
            "lone zero block then data",
            [file("a", b"kept"), vec![0u8; 512], file("hidden", b"x"), end()].concat(),
        ),
        ("no end blocks", file("a", b"kept")),
        ("cut in a member", {
            let mut v = [file("a", b"kept"), file("big", &[7u8; 4096])].concat();
            v.truncate(v.len() - 2000);
            v
        }),
        // CVE-2025-62518: a pax size of 0 over a ustar size hides members in a file's body.
        ("pax size 0 over a ustar size", {
            let hidden = [file("hidden", b"smuggled"), end()].concat();
            [
                file("a", b"kept"),
                pax(b'x', &[("size", b"0")]),
                member("carrier", b'0', &hidden, 0o644),
                end(),
            ]
            .concat()
        }),
        (
            "pax and ustar sizes differ",
            [
                file("a", b"kept"),
                pax(b'x', &[("size", b"3")]),
                file("c", b"12345"),
                end(),
            ]
            .concat(),
        ),
        (
            "pax state outliving its entry",
            [
                file("a", b"kept"),
                pax(b'x', &[("path", b"p1")]),
                pax(b'x', &[("path", b"p2")]),
                file("c", b"x"),
                end(),
            ]
            .concat(),
        ),
        ("a pax size applied to a long-name member", {
            let mut l = header(b"././@LongLink", b'L', 4, 0o644, b"").to_vec();
            l.extend(padded(b"abc\0"));
            [
                file("a", b"kept"),
                pax(b'x', &[("size", b"4")]),
                l,
                file("c", b"x"),
                end(),
            ]
            .concat()
        }),
        (
            "malformed pax records",
            [
                file("a", b"kept"),
                member("PaxHeaders/x", b'x', b"99 path=x\n", 0o644),
                file("c", b"x"),
                end(),
            ]
            .concat(),
        ),
        (
            "a pax header with no member after it",
            [file("a", b"kept"), pax(b'x', &[("path", b"p")]), end()].concat(),
        ),
        (
            "an oversized pax header",
            [
                file("a", b"kept"),
                pax(b'x', &[("comment", &vec![b'c'; 70_000])]),
                file("c", b"x"),
                end(),
            ]
            .concat(),
        ),
    ];
    for (what, bytes) in cases {
        let d = tempfile::tempdir().unwrap();
        let r = run(&bytes, d.path());
        assert_eq!(stopped(&r), Some(StopReason::Malformed), "{what}: {r:?}");
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"kept", "{what}");
        let names = tree(d.path());
        assert!(
            !names
                .iter()
                .any(|n| n.contains("hidden") || n.contains(".agentbox-extract") || n == "big"),
            "{what}: {names:?}"
        );
    }
}

#[test]
fn bounds_stop_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let a = archive(&[file("a", b"1"), file("b", &[0u8; 10_000]), file("c", b"3")]);
    let r = extract(
        &a[..],
        d.path(),
        &Options {
            max_bytes: 4096,
            ..Default::default()
        },
    );
    assert_eq!(stopped(&r), Some(StopReason::TooLarge), "{r:?}");
    assert_eq!(tree(d.path()), vec!["a"]);
    let d = tempfile::tempdir().unwrap();
    let r = extract(
        &a[..],
        d.path(),
        &Options {
            max_entries: 2,
            ..Default::default()
        },
    );
    assert_eq!(stopped(&r), Some(StopReason::TooManyEntries), "{r:?}");
    assert_eq!(r.written, 2);
}

#[test]
fn admit_and_keep_newer() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("newer"), b"host").unwrap();
    let admit: agentbox_sync::Admit = std::sync::Arc::new(|p: &str, _| !p.starts_with("secret"));
    let a = archive(&[file("secret/key", b"x"), file("newer", b"box"), file("ok", b"y")]);
    let r = extract(
        &a[..],
        d.path(),
        &Options {
            keep_newer: true,
            admit: Some(admit),
            ..Default::default()
        },
    );
    assert_eq!(
        (
            r.skipped[&SkipReason::NotAdmitted],
            r.skipped[&SkipReason::KeptNewer],
            r.written
        ),
        (1, 1, 1),
        "{r:?}"
    );
    assert_eq!(std::fs::read(d.path().join("newer")).unwrap(), b"host");
}

#[test]
fn gnu_tar_round_trips_and_the_chunked_extractor_agrees() {
    let src = tempfile::tempdir().unwrap();
    for i in 0..50 {
        let p = src.path().join(format!("d{}/f{i}.txt", i % 5));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("file {i}\n").repeat(i * 10)).unwrap();
    }
    std::fs::write(src.path().join(format!("{}.txt", "long".repeat(40))), b"long name").unwrap();
    let out = std::process::Command::new("tar")
        .args(["-c", "-f", "-", "-C"])
        .arg(src.path())
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success());
    let d = tempfile::tempdir().unwrap();
    let r = run(&out.stdout, d.path());
    assert_eq!(r.stopped, None, "{r:?}");
    assert_eq!(tree(d.path()), tree(src.path()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let d2 = tempfile::tempdir().unwrap();
    let r2 = rt.block_on(async {
        let mut x = agentbox_sync::Extractor::new(d2.path().to_path_buf(), Options::default());
        // GNU tar pads its archive past the end marker to a whole record (10 KiB): the
        // extractor may finish at the marker and refuse the padding after it (write answers
        // false), or take it all, depending on how far it got while the chunks were queued.
        // Either way, what it wrote must be what the whole reader wrote.
        for chunk in out.stdout.chunks(777) {
            if !x.write(chunk.to_vec()).await {
                break;
            }
        }
        x.finish().await
    });
    assert_eq!(r2, r);
    assert_eq!(tree(d2.path()), tree(src.path()));
}

#[test]
fn remove_entries_unlinks_and_never_follows() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"x").unwrap();
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("full/sub")).unwrap();
    std::fs::create_dir(d.path().join("empty")).unwrap();
    std::fs::write(d.path().join("f"), b"x").unwrap();
    std::os::unix::fs::symlink(outside.path().join("precious"), d.path().join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), d.path().join("via")).unwrap();
    let paths: Vec<String> = ["f", "link", "full", "empty", "via/precious", "../x", "missing"]
        .map(String::from)
        .to_vec();
    let r = agentbox_sync::remove_entries(d.path(), &paths).unwrap();
    assert_eq!(r.removed, 3, "{r:?}");
    assert_eq!(r.left, vec!["full", "via/precious", "../x", "missing"]);
    assert!(outside.path().join("precious").exists());
    assert_eq!(tree(d.path()), vec!["full", "full/sub", "via"]);
}

#[test]
fn every_skip_and_every_write_is_told_as_it_happens() {
    use std::sync::{Arc, Mutex};
    let d = tempfile::tempdir().unwrap();
    // More links than the receipt names: `on_skip` hears each one, with its target.
    let mut members: Vec<Vec<u8>> = (0..150)
        .map(|i| link(&format!("l{i}"), b'2', &format!("/target/{i}")))
        .collect();
    members.push(file("kept", b"x"));
    members.push(link("..", b'5', ""));
    let a = archive(&members);
    let skips = Arc::new(Mutex::new(Vec::new()));
    let written = Arc::new(Mutex::new(Vec::new()));
    let (s, w) = (skips.clone(), written.clone());
    let opts = Options {
        on_skip: Some(Arc::new(move |k: &agentbox_sync::Skip| {
            s.lock().unwrap().push(k.clone())
        })),
        on_written: Some(Arc::new(move |p: &str, kind| {
            w.lock().unwrap().push((p.to_string(), kind))
        })),
        ..Default::default()
    };
    let r = extract(&a[..], d.path(), &opts);
    let skips = skips.lock().unwrap();
    assert_eq!(
        r.skips.len(),
        agentbox_sync::MAX_NAMED_SKIPS,
        "the receipt names the first 100"
    );
    assert_eq!(skips.len() as u64, r.skipped_total(), "on_skip hears every skip");
    assert_eq!(skips.len(), 151);
    assert_eq!(skips[149].path, "l149");
    assert_eq!(skips[149].target.as_deref(), Some("/target/149"));
    assert_eq!(skips[150].reason, SkipReason::UnsafeName);
    assert_eq!(
        *written.lock().unwrap(),
        vec![("kept".to_string(), agentbox_sync::Kind::File)]
    );
}
