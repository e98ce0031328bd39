//! The extractor's temporary names are its own business: names already in the destination
//! (written there earlier, or by the same archive: a box chooses its members' names) never
//! stop an extraction. Alone in its binary, so the extractor's counter starts at 0 here.

mod common;

use common::*;

#[test]
fn a_name_taken_by_a_temporary_s_form_does_not_stop_the_extraction() {
    let dest = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    for n in 0..64 {
        std::fs::write(dest.path().join(format!(".agentbox-extract-{pid}-{n}")), b"taken").unwrap();
    }
    // And the archive itself names what the next temporaries would be called.
    let squat: Vec<String> = (64..72).rev().map(|n| format!(".agentbox-extract-{pid}-{n}")).collect();
    let mut members: Vec<Vec<u8>> = squat.iter().map(|n| file(n, b"squat")).collect();
    members.push(file("f", b"mine"));
    let r = agentbox_sync::extract(&archive(&members)[..], dest.path(), &Default::default());
    assert_eq!((r.written, r.stopped), (9, None));
    assert_eq!(std::fs::read(dest.path().join("f")).unwrap(), b"mine");
    for n in 0..64 {
        assert_eq!(
            std::fs::read(dest.path().join(format!(".agentbox-extract-{pid}-{n}"))).unwrap(),
            b"taken"
        );
    }
    for n in &squat {
        assert_eq!(std::fs::read(dest.path().join(n)).unwrap(), b"squat");
    }
    let names = std::fs::read_dir(dest.path()).unwrap().count();
    assert_eq!(names, 64 + 8 + 1, "a temporary was left");
}
