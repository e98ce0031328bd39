//! `scripts/fuzz` (or `cargo +nightly fuzz run extract`): the extractor over arbitrary bytes,
//! the tree it leaves compared with what the archive says. Its corpus, `fuzz/corpus/extract`,
//! also runs in CI through `crates/agentbox-sync/tests/fuzz_corpus.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentbox_sync::fuzzing::extract_confined(data);
});
