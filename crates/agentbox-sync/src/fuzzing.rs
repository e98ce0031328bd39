//! The property the fuzz target checks, shared with the test that runs its corpus in CI:
//! whatever the bytes, the extractor does not panic, writes nothing outside the destination
//! (also through links planted in it), and leaves no file with a mode above 0755.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::{Options, extract};

/// Extract `data` into a fresh destination holding two links that point outside, and check.
pub fn extract_confined(data: &[u8]) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("agentbox-fuzz-{}-{n}", std::process::id()));
    let (dest, outside) = (root.join("dest"), root.join("outside"));
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink("../outside", dest.join("escape")).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("abs")).unwrap();
    let receipt = extract(
        data,
        &dest,
        &Options {
            max_bytes: 4 << 20,
            max_entries: 2000,
            ..Default::default()
        },
    );
    let escaped: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        escaped.is_empty(),
        "wrote outside the destination: {escaped:?} ({receipt:?})"
    );
    check_tree(&dest);
    let _ = std::fs::remove_dir_all(&root);
}

fn check_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        let name = e.file_name();
        if meta.file_type().is_symlink() {
            assert!(name == "escape" || name == "abs", "a link was created: {:?}", e.path());
            continue;
        }
        assert!(
            meta.is_dir() || meta.is_file(),
            "neither file nor directory: {:?}",
            e.path()
        );
        let mode = meta.permissions().mode() & 0o7777;
        assert!(mode & !0o755 == 0, "{:?} has mode {mode:o}", e.path());
        assert!(
            !name.to_string_lossy().starts_with(".agentbox-extract"),
            "a temporary file was left: {:?}",
            e.path()
        );
        if meta.is_dir() {
            check_tree(&e.path());
        }
    }
}
