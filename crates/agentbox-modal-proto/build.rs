//! Compile Modal's two protocol files (vendored under `proto/`, unchanged) into Rust: prost
//! messages and tonic clients and servers for both services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/modal_proto/api.proto", "proto/modal_proto/task_command_router.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        // The fake serves a handful of Modal's ~250 calls; the rest answer `unimplemented`.
        .generate_default_stubs(true)
        // No `connect(url)` helpers: each side builds its own channel or server.
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
