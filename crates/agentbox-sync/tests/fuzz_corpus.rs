//! The fuzz target's corpus (`fuzz/corpus/extract`), run as a test so CI checks it on stable.

mod common;

use common::*;

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/extract")
}

/// Seeds for the corpus: every hostile shape, plus archives that escape through the links
/// the fuzz property plants (`escape/`, `abs/`). `AGENTBOX_WRITE_CORPUS=1` writes them.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let long = "n".repeat(150);
    let mut gnu_long = header(b"././@LongLink", b'L', long.len() as u64 + 1, 0o644, b"").to_vec();
    gnu_long.extend(padded(&[long.as_bytes(), b"\0"].concat()));
    vec![
        (
            "plain",
            archive(&[dir("d/"), file("d/f", b"x"), member("x.sh", b'0', b"#!", 0o6777)]),
        ),
        (
            "through-relative-link",
            archive(&[file("escape/pwned", b"x"), dir("escape/sub/")]),
        ),
        ("through-absolute-link", archive(&[file("abs/pwned", b"x")])),
        (
            "dotdot",
            archive(&[file("../pwned", b"x"), file("d/../../pwned", b"x")]),
        ),
        ("absolute", archive(&[file("/tmp/agentbox-pwned", b"x")])),
        (
            "symlink-then-file",
            archive(&[link("l", b'2', "../outside"), file("l/pwned", b"x")]),
        ),
        ("hardlink", archive(&[link("h", b'1', "/etc/passwd")])),
        (
            "pax-path-escape",
            archive(&[pax(b'x', &[("path", b"../pwned")]), file("a", b"x")]),
        ),
        (
            "pax-size-zero",
            [
                pax(b'x', &[("size", b"0")]),
                member("carrier", b'0', &archive(&[file("../pwned", b"x")]), 0o644),
                end(),
            ]
            .concat(),
        ),
        (
            "pax-twice",
            archive(&[
                pax(b'x', &[("path", b"a")]),
                pax(b'x', &[("path", b"b")]),
                file("c", b"x"),
            ]),
        ),
        ("gnu-long-name", archive(&[gnu_long, file("short", b"x")])),
        (
            "pax-global",
            archive(&[pax(b'g', &[("path", b"escape/pwned")]), file("a", b"x")]),
        ),
        (
            "lone-zero-block",
            [file("a", b"x"), vec![0; 512], file("escape/pwned", b"x")].concat(),
        ),
        ("cut", file("big", &[1; 3000])[..1500].to_vec()),
        (
            "dir-over-file",
            archive(&[file("f", b"x"), dir("f/"), file("f/x", b"y")]),
        ),
        ("garbage", (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect()),
    ]
}

#[test]
fn the_fuzz_corpus_passes() {
    let dir = corpus_dir();
    if std::env::var_os("AGENTBOX_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("the corpus directory").flatten() {
        agentbox_sync::fuzzing::extract_confined(&std::fs::read(e.path()).unwrap());
        n += 1;
    }
    assert!(
        n >= seeds().len(),
        "the corpus holds {n} archives, fewer than its seeds"
    );
    for (_, bytes) in seeds() {
        agentbox_sync::fuzzing::extract_confined(&bytes);
    }
}
