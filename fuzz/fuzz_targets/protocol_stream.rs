//! `scripts/fuzz` (or `cargo +nightly fuzz run protocol_stream`): a byte stream of the
//! runner's `Message`s (stdio, unix socket, relay), lengths bounded before any allocation,
//! each message encoding back to its bytes, its text read as a request and an answer, its
//! binary as a frame. Its corpus also runs in CI through
//! `crates/agentbox-protocol/tests/fuzz_corpus.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentbox_protocol::fuzzing::stream(data);
});
