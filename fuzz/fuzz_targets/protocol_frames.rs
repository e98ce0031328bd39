//! `scripts/fuzz` (or `cargo +nightly fuzz run protocol_frames`): the runner's binary frames,
//! protocol 2 (`unframe`) and 3 (`unframe_seq`), each decoded frame encoding back to its
//! bytes. Its corpus also runs in CI through `crates/agentbox-protocol/tests/fuzz_corpus.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentbox_protocol::fuzzing::frames(data);
});
