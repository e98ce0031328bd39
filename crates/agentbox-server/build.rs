//! The page's terminal, xterm.js, embedded in the binary: `scripts/page-assets` installs it
//! from npm (pinned in `page/package-lock.json`, never committed as a copy), and this script
//! puts its files in `OUT_DIR` for `include_bytes!`. Built without it, the page serves a
//! module that says how to get it, and every other view works.

use std::path::{Path, PathBuf};

/// Each file the page serves from the package, and where it is under `page/node_modules`.
const FILES: [(&str, &str); 3] = [
    ("xterm.mjs", "@xterm/xterm/lib/xterm.mjs"),
    ("xterm.css", "@xterm/xterm/css/xterm.css"),
    ("addon-fit.mjs", "@xterm/addon-fit/lib/addon-fit.mjs"),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let modules = Path::new("page/node_modules");
    let found = FILES.iter().all(|(_, from)| modules.join(from).is_file());
    for (name, from) in FILES {
        let from = modules.join(from);
        println!("cargo::rerun-if-changed={}", from.display());
        let bytes = if found {
            std::fs::read(&from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()))
        } else {
            missing(name).into_bytes()
        };
        std::fs::write(out.join(name), bytes).unwrap_or_else(|e| panic!("writing {name} to OUT_DIR: {e}"));
    }
    println!("cargo::rerun-if-changed=page/package-lock.json");
    println!(
        "cargo::rustc-env=AGENTBOX_PAGE_TERMINAL={}",
        if found { "xterm.js" } else { "" }
    );
}

/// What the page serves in a file's place when the package was not installed at build time.
fn missing(name: &str) -> String {
    let why = "this agentbox was built without xterm.js: run scripts/page-assets, then build again";
    match name {
        "xterm.css" => format!("/* {why} */\n"),
        "addon-fit.mjs" => "export class FitAddon { activate() {} dispose() {} fit() {} }\n".to_string(),
        _ => format!("export class Terminal {{ constructor() {{ throw new Error({why:?}); }} }}\n"),
    }
}
