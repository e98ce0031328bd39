//! A test that runs itself again as a child: the child plays its part and reports no test
//! result of its own; a stray variable does not make a test a child.

use std::process::Command;

use agentbox_testing::reexec;

const TEST: &str = "a_child_plays_its_part_and_is_no_test_of_its_own";

#[test]
fn a_child_plays_its_part_and_is_no_test_of_its_own() {
    if reexec::part().as_deref() == Some("echo") {
        println!("\nPART echo");
        reexec::done();
    }
    let out = reexec::child(TEST, "echo").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l == "PART echo"), "{text}");
    assert!(
        !text.contains("test result"),
        "the child reported itself a test: {text}"
    );
}

#[test]
fn a_stray_variable_does_not_make_a_test_a_child() {
    // As if a shell had the variable: it names a process that is not this test's parent.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--test-threads", "1"])
        .env(reexec::PART_ENV, "1:echo")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("test result: ok. 1 passed"),
        "the test did not run its scenario: {text}"
    );
}
