//! `scripts/fuzz` (or `cargo +nightly fuzz run protocol_json`): the runner's JSON requests and
//! answers and the supervisor's length-prefixed frames, each parsed value serialising to JSON
//! that parses back to it. Its corpus also runs in CI through
//! `crates/agentbox-protocol/tests/fuzz_corpus.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentbox_protocol::fuzzing::json(data);
});
