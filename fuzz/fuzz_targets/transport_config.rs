//! `scripts/fuzz` (or `cargo +nightly fuzz run transport_config`): the transport config from
//! TOML and JSON text, every refusal naming the config, and a TOML document and its JSON
//! translation saying the same. Its corpus also runs in CI through
//! `crates/agentbox-transport/tests/fuzz_corpus.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentbox_transport::fuzzing::config(data);
});
