//! The transport config fuzz target's corpus (`fuzz/corpus/transport_config`), run as a test
//! so CI checks it on stable. `AGENTBOX_WRITE_CORPUS=1` writes the seeds below into it.

fn seeds() -> Vec<(&'static str, String)> {
    let deep = format!("expose = {}1{}", "[".repeat(120), "]".repeat(120));
    [
        (
            "toml-roles",
            "scope = \"conversation\"\nhands = { default = \"sandbox\", build = \"gpu\" }\n\
             [environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"6h\"\n\
             [environments.gpu]\nprovider = \"docker\"\ncpus = 4\nmemory_mb = 2048\nnetwork = \"none\"\n\
             env = { MODE = \"x\" }\nlabels = { team = \"a\" }\n",
        ),
        (
            "json-roles",
            r#"{"scope":"conversation","hands":{"default":"sandbox","build":"gpu"},
               "environments":{"sandbox":{"provider":"local","max_lifetime":"6h"},
                               "gpu":{"provider":"docker","cpus":4.5,"env":{"MODE":"x"}}}}"#,
        ),
        (
            "toml-one-hand",
            "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\n",
        ),
        ("undeclared-hand", "hands = \"x\""),
        (
            "auto-hand",
            "hands = \"auto\"\n[environments.auto]\nprovider = \"local\"",
        ),
        (
            "no-default-role",
            "hands = { build = \"a\" }\n[environments.a]\nprovider = \"local\"",
        ),
        (
            "bad-lifetime",
            "[environments.a]\nprovider = \"local\"\nmax_lifetime = \"soon\"",
        ),
        (
            "unknown-key",
            "[environments.a]\nprovider = \"local\"\ncolour = \"red\"",
        ),
        ("bad-scope", "scope = \"forever\""),
        ("expose", "expose = [1]"),
        ("bad-name", "[environments.\"a b\"]\nprovider = \"local\""),
        (
            "reserved-label",
            "[environments.a]\nprovider = \"local\"\nlabels = { \"agentbox.x\" = \"1\" }",
        ),
        ("negative-cpus", "[environments.a]\nprovider = \"local\"\ncpus = -1.0"),
        ("nan-cpus", "[environments.a]\nprovider = \"local\"\ncpus = nan"),
        ("datetime", "[environments.a]\nprovider = 1979-05-27T07:32:00Z"),
        ("zero-memory", "[environments.a]\nprovider = \"local\"\nmemory_mb = 0"),
        (
            "bad-env",
            "[environments.a]\nprovider = \"local\"\nenv = { \"A=B\" = \"1\" }",
        ),
        ("cut", "[environments.a\nprovider"),
        (
            "json-null",
            r#"{"hands":null,"environments":{"a":{"provider":"local","cpus":null}}}"#,
        ),
        ("deep", deep.as_str()),
    ]
    .into_iter()
    .map(|(n, t)| (n, t.to_string()))
    .collect()
}

#[test]
fn the_fuzz_corpus_passes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/transport_config");
    if std::env::var_os("AGENTBOX_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in seeds() {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("the corpus directory").flatten() {
        agentbox_transport::fuzzing::config(&std::fs::read(e.path()).unwrap());
        n += 1;
    }
    assert!(n >= seeds().len(), "the corpus holds {n} configs, fewer than its seeds");
    for (_, text) in seeds() {
        agentbox_transport::fuzzing::config(text.as_bytes());
    }
}
