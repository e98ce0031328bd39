//! Compile Modal's protocol (the descriptors the `modal` 1.6.4 package ships, vendored under
//! `proto/` by `scripts/modal-proto`) into Rust: prost messages and tonic clients and servers
//! for both services.

use prost::Message;

const DESCRIPTORS: &str = "proto/modal-1.6.4.binpb";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={DESCRIPTORS}");
    let fds = prost_types::FileDescriptorSet::decode(std::fs::read(DESCRIPTORS)?.as_slice())?;
    tonic_prost_build::configure()
        // The fake serves a handful of Modal's ~250 calls; the rest answer `unimplemented`.
        .generate_default_stubs(true)
        // No `connect(url)` helpers: each side builds its own channel or server.
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
