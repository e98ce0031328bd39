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
    let long = format!(".agentbox-extract{}", "n".repeat(133));
    let mut temporary_like_long = header(b"././@LongLink", b'L', long.len() as u64 + 1, 0o644, b"").to_vec();
    temporary_like_long.extend(padded(&[long.as_bytes(), b"\0"].concat()));
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
        // What the fuzzer stopped on: an ordinary member whose name only starts like the
        // extractor's temporaries, which the property once took for a leftover.
        (
            "temporary-like-name",
            archive(&[file(".agentbox-extractnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", b"x")]),
        ),
        (
            "temporary-like-long-name",
            archive(&[temporary_like_long, file("short", b"x")]),
        ),
        // A member named in the temporaries' very form is an ordinary file too.
        ("temporary-form-name", archive(&[file(".agentbox-extract-1-0", b"x")])),
    ]
}

/// A member the archive names is the archive's, whatever its name: one that only starts like
/// the extractor's temporaries (`.agentbox-extract-<pid>-<n>`) is extracted and passes.
#[test]
fn a_member_named_like_a_temporary_is_extracted_and_passes() {
    for name in [
        ".agentbox-extractnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn",
        ".agentbox-extract",
        ".agentbox-extract-1-0",
        "d/.agentbox-extract-x",
    ] {
        let bytes = archive(&[file(name, b"mine")]);
        agentbox_sync::fuzzing::extract_confined(&bytes);
        let dest = tempfile::tempdir().unwrap();
        let r = agentbox_sync::extract(&bytes[..], dest.path(), &Default::default());
        assert_eq!((r.written, r.stopped), (1, None), "{name}");
        assert_eq!(std::fs::read(dest.path().join(name)).unwrap(), b"mine", "{name}");
    }
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
