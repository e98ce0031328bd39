//! The transport over the fake provider (over real local boxes, with faults scripted on top):
//! lazy boxes, one creation for concurrent first uses, documents that outlive the host, roles,
//! lost boxes, release and destroy, and what is refused at start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, Provider, SandboxId};
use agentbox_hands::{Command, ExecOptions};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::fake::{FakeProvider, Match, Op, Outcome};
use agentbox_transport::{Documents, MemoryDocuments, SqliteDocuments, Transport, TransportConfig, TransportHost};

struct World {
    _home: tempfile::TempDir,
    fake: FakeProvider,
}

fn world() -> World {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let local = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
    World {
        fake: FakeProvider::over(Arc::new(local)),
        _home: home,
    }
}

const ONE: &str = "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\nlabels = { env = \"sandbox\" }\n";
const ROLES: &str = "hands = { default = \"sandbox\", build = \"builder\" }\n\
    [environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\nlabels = { env = \"sandbox\" }\n\
    [environments.builder]\nprovider = \"local\"\nmax_lifetime = \"10m\"\nlabels = { env = \"builder\" }\n";

fn host(w: &World, docs: Arc<dyn Documents>) -> TransportHost {
    TransportHost {
        providers: BTreeMap::from([("local".to_string(), Arc::new(w.fake.clone()) as Arc<dyn Provider>)]),
        documents: docs,
        session: "session-1".into(),
        labels: BTreeMap::from([("session".to_string(), "session-1".to_string())]),
        on_lost: None,
        prepare: None,
    }
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_is_made_at_the_first_operation_and_written_down_first() {
    let w = world();
    let docs: Arc<dyn Documents> = Arc::new(MemoryDocuments::default());
    let t = Transport::new(TransportConfig::from_toml(ONE).unwrap(), host(&w, docs.clone())).unwrap();
    let env = t.env("c1").unwrap();
    assert!(env.id().ends_with(":unopened"), "{}", env.id());
    assert_eq!(env.cwd(), ".");
    assert!(
        w.fake.calls_of(Op::Create).is_empty(),
        "nothing is made before an operation"
    );
    env.write_file("a.txt", b"hello", &ctx()).await.unwrap();
    let creates = w.fake.calls_of(Op::Create);
    assert_eq!(creates.len(), 1);
    let spec = creates[0].spec.clone().unwrap();
    assert_eq!(
        spec.labels.get("session").map(String::as_str),
        Some("session-1"),
        "the host's labels"
    );
    assert_eq!(
        spec.labels.get("env").map(String::as_str),
        Some("sandbox"),
        "the environment's labels"
    );
    assert!(env.id().starts_with("agentbox:local:"), "{}", env.id());
    assert_ne!(env.cwd(), ".");
    let named = docs.list("session-1", "transport.boxes/").await.unwrap();
    assert_eq!(named.len(), 1);
    let id = named[0].1["id"].as_str().unwrap().to_string();
    assert!(env.id().ends_with(id.split(':').nth(1).unwrap()));
    assert_eq!(env.read_text_file("a.txt", &ctx()).await.unwrap(), "hello");
    t.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_uses_share_one_creation() {
    let w = world();
    w.fake
        .on(Match::op(Op::Create), Outcome::Delay(Duration::from_millis(300)), None);
    let t = Transport::new(
        TransportConfig::from_toml(ONE).unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .unwrap();
    let env = t.env("c1").unwrap();
    let mut all = Vec::new();
    for i in 0..5 {
        let env = env.clone();
        all.push(tokio::spawn(async move {
            env.write_file(&format!("f{i}"), b"x", &ctx()).await
        }));
    }
    for a in all {
        a.await.unwrap().unwrap();
    }
    assert_eq!(w.fake.calls_of(Op::Create).len(), 1);
    t.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_that_cannot_be_made_is_that_calls_error_and_the_next_call_asks_again() {
    let w = world();
    w.fake.on(
        Match::op(Op::Create),
        Outcome::Fail(ErrorCode::Refused, "quota exhausted".into()),
        Some(1),
    );
    let t = Transport::new(
        TransportConfig::from_toml(ONE).unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .unwrap();
    let env = t.env("c1").unwrap();
    let e = env.write_file("a", b"x", &ctx()).await.unwrap_err();
    assert!(
        e.message.contains("refused") && e.message.contains("quota exhausted"),
        "{e}"
    );
    // The rule fired once: the next call asks for a box again, and gets one.
    let ran = env
        .exec(Command::Shell("true".into()), ExecOptions::default(), &ctx())
        .await
        .unwrap();
    assert_eq!(ran.exit_code, 0);
    assert_eq!(w.fake.calls_of(Op::Create).len(), 2);
    t.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_opened_later_over_the_same_documents_attaches() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.db");
    let first = Transport::new(
        TransportConfig::from_toml(ONE).unwrap(),
        host(&w, Arc::new(SqliteDocuments::open(&path).unwrap())),
    )
    .unwrap();
    let env = first.env("c1").unwrap();
    env.write_file("kept.txt", b"from the first host", &ctx())
        .await
        .unwrap();
    let id = env.id();
    first.release();
    drop(first);

    let second = Transport::new(
        TransportConfig::from_toml(ONE).unwrap(),
        host(&w, Arc::new(SqliteDocuments::open(&path).unwrap())),
    )
    .unwrap();
    let env = second.env("c1").unwrap();
    assert_eq!(
        env.read_text_file("kept.txt", &ctx()).await.unwrap(),
        "from the first host"
    );
    assert_eq!(env.id(), id);
    assert_eq!(w.fake.calls_of(Op::Create).len(), 1, "found again, not made again");
    assert_eq!(w.fake.calls_of(Op::Attach).len(), 1);
    second.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_lost_behind_the_sessions_back_is_one_failed_call_and_on_lost_fires_once() {
    let w = world();
    let lost = Arc::new(AtomicUsize::new(0));
    let mut h = host(&w, Arc::new(MemoryDocuments::default()));
    let counter = lost.clone();
    h.on_lost = Some(Arc::new(move |l| {
        assert!(l.why.contains("gone"), "{}", l.why);
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let t = Transport::new(TransportConfig::from_toml(ONE).unwrap(), h).unwrap();
    let env = t.env("c1").unwrap();
    env.write_file("a", b"x", &ctx()).await.unwrap();
    let id: SandboxId = env.id().strip_prefix("agentbox:").unwrap().parse().unwrap();
    w.fake.end_box(&id).await;
    // Three calls at once find it out; the hook hears of it once.
    let mut all = Vec::new();
    for _ in 0..3 {
        let env = env.clone();
        all.push(tokio::spawn(async move { env.read_text_file("a", &ctx()).await }));
    }
    let results: Vec<_> = futures_results(all).await;
    assert!(
        results
            .iter()
            .any(|r| r.as_ref().is_err_and(|e| e.message.contains("gone"))),
        "the lost box failed a call, saying gone: {results:?}"
    );
    // A call that came after the loss was found asked for a new box, where `a` is not.
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            r.message.contains("gone") || r.code == agentbox_hands::FsCode::NotFound,
            "{r}"
        );
    }
    assert_eq!(lost.load(Ordering::SeqCst), 1);
    // The next call asks for a box again.
    env.write_file("b", b"y", &ctx()).await.unwrap();
    assert_eq!(w.fake.calls_of(Op::Create).len(), 2);
    assert_ne!(env.id(), format!("agentbox:{id}"));
    t.destroy(&ctx()).await.unwrap();
}

async fn futures_results<T>(all: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for a in all {
        out.push(a.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_point_a_conversation_elsewhere_and_a_fork_starts_on_the_default() {
    let w = world();
    let docs: Arc<dyn Documents> = Arc::new(MemoryDocuments::default());
    let t = Transport::new(TransportConfig::from_toml(ROLES).unwrap(), host(&w, docs.clone())).unwrap();
    let env = t.env("c1").unwrap();
    env.write_file("a", b"x", &ctx()).await.unwrap();
    t.assign("c1", "build").await.unwrap();
    env.write_file("b", b"x", &ctx()).await.unwrap();
    let creates = w.fake.calls_of(Op::Create);
    let envs: Vec<String> = creates
        .iter()
        .map(|c| c.spec.as_ref().unwrap().labels["env"].clone())
        .collect();
    assert_eq!(envs, ["sandbox", "builder"]);
    assert_eq!(
        docs.get("session-1", "transport.hands/c1").await.unwrap(),
        Some(serde_json::json!("build"))
    );
    // A fork (another conversation) runs on the default: the sandbox box, already made.
    t.env("c1-fork").unwrap().write_file("c", b"x", &ctx()).await.unwrap();
    assert_eq!(w.fake.calls_of(Op::Create).len(), 2);
    assert!(t.assign("c1", "nowhere").await.is_err());
    assert_eq!(t.destroy(&ctx()).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_leaves_boxes_running_and_destroy_ends_those_only_the_documents_name() {
    let w = world();
    let docs: Arc<dyn Documents> = Arc::new(MemoryDocuments::default());
    let first = Transport::new(TransportConfig::from_toml(ONE).unwrap(), host(&w, docs.clone())).unwrap();
    let env = first.env("c1").unwrap();
    env.write_file("a", b"x", &ctx()).await.unwrap();
    let id: SandboxId = env.id().strip_prefix("agentbox:").unwrap().parse().unwrap();
    first.release();
    assert!(!w.fake.ended(&id), "release leaves the box running");
    let second = Transport::new(TransportConfig::from_toml(ONE).unwrap(), host(&w, docs.clone())).unwrap();
    let ended = second.destroy(&ctx()).await.unwrap();
    assert_eq!(ended, vec![id.clone()]);
    assert!(w.fake.ended(&id));
    assert!(docs.list("session-1", "transport.boxes/").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_conversation_gives_each_conversation_its_box() {
    let w = world();
    let config = format!("scope = \"conversation\"\n{ONE}");
    let t = Transport::new(
        TransportConfig::from_toml(&config).unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .unwrap();
    let a = t.env("a").unwrap();
    let b = t.env("b").unwrap();
    a.write_file("x", b"1", &ctx()).await.unwrap();
    b.write_file("x", b"2", &ctx()).await.unwrap();
    assert_ne!(a.id(), b.id());
    assert_eq!(a.read_text_file("x", &ctx()).await.unwrap(), "1");
    assert_eq!(t.destroy(&ctx()).await.unwrap().len(), 2);
}

/// A conversation that leaves takes its box with it; the others keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_ends_takes_its_box_and_leaves_the_others() {
    let w = world();
    let config = format!("scope = \"conversation\"\n{ONE}");
    let docs: Arc<dyn Documents> = Arc::new(MemoryDocuments::default());
    let t = Transport::new(TransportConfig::from_toml(&config).unwrap(), host(&w, docs.clone())).unwrap();
    let (a, b) = (t.env("a").unwrap(), t.env("b").unwrap());
    assert!(t.opened("a").is_none(), "no box before the first call");
    a.write_file("x", b"1", &ctx()).await.unwrap();
    b.write_file("x", b"2", &ctx()).await.unwrap();
    let a_box = t.opened("a").expect("a's box is open").sandbox().id().clone();
    assert_eq!(a.id(), format!("agentbox:{a_box}"));
    let ended = t.end("a", &ctx()).await.unwrap();
    assert_eq!(ended, vec![a_box.clone()]);
    assert!(t.opened("a").is_none());
    assert!(
        w.fake.attach(&a_box, &ctx()).await.unwrap().is_none(),
        "a's box is gone"
    );
    assert_eq!(b.read_text_file("x", &ctx()).await.unwrap(), "2", "b's box goes on");
    assert_eq!(docs.list("session-1", "transport.boxes/").await.unwrap().len(), 1);
    assert_eq!(t.destroy(&ctx()).await.unwrap().len(), 1);
}

/// The host readies each box it makes before any tool runs in it; a box it could not ready
/// ends, the call that asked is told why, and the next call makes a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_readies_each_new_box_before_its_first_tool_and_a_box_it_cannot_ready_ends() {
    let w = world();
    let readied = Arc::new(AtomicUsize::new(0));
    let mut h = host(&w, Arc::new(MemoryDocuments::default()));
    let count = readied.clone();
    h.prepare = Some(Arc::new(move |env, ctx| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n == 0 {
                return Err(agentbox_core::Error::refused("the seed did not fit"));
            }
            use agentbox_hands::ExecutionEnv as _;
            env.write_file("seeded", b"by the host", &ctx)
                .await
                .map_err(|e| agentbox_core::Error::unknown(e.to_string()))
        })
    }));
    let t = Transport::new(TransportConfig::from_toml(ONE).unwrap(), h).unwrap();
    let env = t.env("c1").unwrap();
    let e = env.read_text_file("seeded", &ctx()).await.unwrap_err();
    assert!(e.message.contains("the seed did not fit"), "{e}");
    assert_eq!(w.fake.calls_of(Op::Create).len(), 1);
    assert_eq!(
        w.fake.calls_of(Op::Destroy).len(),
        1,
        "the box that could not be readied ended"
    );
    assert_eq!(env.read_text_file("seeded", &ctx()).await.unwrap(), "by the host");
    assert_eq!(env.read_text_file("seeded", &ctx()).await.unwrap(), "by the host");
    assert_eq!(readied.load(Ordering::SeqCst), 2, "readied once per box made");
    t.destroy(&ctx()).await.unwrap();
}

#[test]
fn what_the_host_cannot_serve_is_refused_at_start() {
    let w = world();
    let docker = "hands = \"gpu\"\n[environments.gpu]\nprovider = \"docker\"\n";
    let e = Transport::new(
        TransportConfig::from_toml(docker).unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .err()
    .unwrap();
    assert!(
        e.message().contains("environments.gpu.provider") && e.message().contains("passed local"),
        "{e}"
    );
    let allowlist = "hands = \"s\"\n[environments.s]\nprovider = \"local\"\nnetwork = \"none\"\n";
    let e = Transport::new(
        TransportConfig::from_toml(allowlist).unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .err()
    .unwrap();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    // No hands: the host's own environment.
    let none = Transport::new(
        TransportConfig::from_toml("[environments.s]\nprovider = \"local\"\n").unwrap(),
        host(&w, Arc::new(MemoryDocuments::default())),
    )
    .unwrap();
    assert!(none.env("c1").is_none());
    // Hands on a `local` environment, and the host passed no local provider: the host's own
    // environment too (the seed's rule), while its other environments still get boxes.
    let mut only_docker = host(&w, Arc::new(MemoryDocuments::default()));
    only_docker.providers = BTreeMap::from([("docker".to_string(), Arc::new(w.fake.clone()) as Arc<dyn Provider>)]);
    let local_hands = "hands = { default = \"here\", build = \"box\" }\n\
        [environments.here]\nprovider = \"local\"\nmaxLifetime = \"6h\"\n\
        [environments.box]\nprovider = \"docker\"\n";
    let t = Transport::new(TransportConfig::from_toml(local_hands).unwrap(), only_docker).unwrap();
    assert!(t.env("c1").is_none(), "the host serves its local environment itself");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The conversation has no environment of the transport's to move: both refused.
        let e = t.assign("c1", "here").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
        assert!(e.message().contains("serves itself"), "{e}");
        let e = t.assign("c1", "build").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
        assert!(e.message().contains("this host's own"), "{e}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentbox_s_providers_come_from_its_registry() {
    use agentbox_providers::helper::HelperCommand;
    use agentbox_providers::registry::{self, Environment, Options};
    let home = tempfile::tempdir().unwrap();
    let env = Environment::from_vars([("AGENTBOX_HOME", home.path())])
        .with_program(HelperCommand::discover().expect("the agentbox-runner binary"));
    let config = TransportConfig::from_toml(
        "hands = \"a\"\n[environments.a]\nprovider = \"local\"\n[environments.b]\nprovider = \"local\"\n",
    )
    .unwrap();
    let providers = config.registry_providers(&Options::default(), &env).await.unwrap();
    assert_eq!(providers.keys().collect::<Vec<_>>(), ["local"], "one provider for both");
    assert_eq!(providers["local"].name(), "local");

    // A name agentbox does not have: the environment named, and every provider listed.
    let typo = TransportConfig::from_toml("hands = \"gpu\"\n[environments.gpu]\nprovider = \"dokcer\"\n").unwrap();
    let e = typo.registry_providers(&Options::default(), &env).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().contains("environments.gpu.provider"), "{e}");
    for name in registry::names() {
        assert!(e.message().contains(name), "{e} should name {name}");
    }
    // A host that passes its own providers: an unknown name lists agentbox's too.
    let w = world();
    let e = Transport::new(typo, host(&w, Arc::new(MemoryDocuments::default())))
        .err()
        .unwrap();
    assert!(
        e.message().contains("passed local") && e.message().contains(&registry::choices()),
        "{e}"
    );
}

/// A command started in the background through the conversation's box (opened by that start)
/// is kept by the box: the same environment reads and ends it by its handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_command_is_kept_by_the_conversations_box() {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let mut opts = LocalOptions::at(home.path()).unwrap();
    opts.runner = true;
    let host = TransportHost {
        providers: BTreeMap::from([(
            "local".to_string(),
            Arc::new(LocalProvider::new(opts).unwrap()) as Arc<dyn Provider>,
        )]),
        documents: Arc::new(MemoryDocuments::default()),
        session: "session-1".into(),
        labels: BTreeMap::new(),
        on_lost: None,
        prepare: None,
    };
    let t = Transport::new(TransportConfig::from_toml(ONE).unwrap(), host).unwrap();
    let env = t.env("c1").unwrap();
    let handle = env
        .start(
            Command::Shell("echo kept; sleep 30".into()),
            agentbox_hands::StartOptions::default(),
            &ctx(),
        )
        .await
        .unwrap();
    let ps = env.processes(&ctx()).await.unwrap();
    let got = ps
        .read(handle, 0, Duration::from_secs(10), 1 << 16, &ctx())
        .await
        .unwrap();
    let text: Vec<u8> = got.chunks.iter().flat_map(|c| c.bytes.clone()).collect();
    assert_eq!(text, b"kept\n");
    ps.signal(handle, agentbox_core::SIGKILL, &ctx()).await.unwrap();
    let end = ps
        .read(handle, got.next, Duration::from_secs(10), 1 << 16, &ctx())
        .await
        .unwrap();
    assert!(
        matches!(end.exit, Some(agentbox_core::ProcessState::Exited { status }) if status.signal == Some(9)),
        "{:?}",
        end.exit
    );
    t.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_with_a_pool_takes_a_ready_box() {
    let w = world();
    let docs: Arc<dyn Documents> = Arc::new(MemoryDocuments::default());
    let config = TransportConfig::from_toml(&format!("{ONE}pool = 2\n")).unwrap();
    assert_eq!(config.environments["sandbox"].pool, 2);
    let t = Transport::new(config, host(&w, docs.clone())).unwrap();
    t.warm(&ctx()).await.unwrap();
    let ready: Vec<String> = w
        .fake
        .calls_of(Op::Create)
        .into_iter()
        .filter_map(|c| c.box_id)
        .collect();
    assert_eq!(ready.len(), 2, "the pool's makes: {ready:?}");
    let env = t.env("c1").unwrap();
    env.write_file("a.txt", b"hello", &ctx()).await.unwrap();
    let id: SandboxId = env.id().strip_prefix("agentbox:").unwrap().parse().unwrap();
    assert!(
        ready.iter().any(|r| r == id.name()),
        "{id} is not one of the ready {ready:?}"
    );
    // The box is the session's: its labels are the environment's and the host's, and a
    // transport opened later over the documents attaches to it.
    let b = w.fake.attach(&id, &ctx()).await.unwrap().unwrap();
    assert_eq!(
        b.labels(),
        &BTreeMap::from([
            ("env".to_string(), "sandbox".to_string()),
            ("session".to_string(), "session-1".to_string())
        ])
    );
    let ends = b.facts().ends_at_ms.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        ends > now + 9 * 60_000,
        "the box ends at its environment's lifetime, not the pool's idle one"
    );
    let again = Transport::new(TransportConfig::from_toml(ONE).unwrap(), host(&w, docs.clone())).unwrap();
    let env2 = again.env("c1").unwrap();
    assert_eq!(env2.read_text_file("a.txt", &ctx()).await.unwrap(), "hello");
    assert_eq!(env2.id(), env.id());
    // Closed, the pools' ready boxes end; the session's box does not.
    t.close_pools(&ctx()).await.unwrap();
    let left = w.fake.list(&BTreeMap::new(), &ctx()).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id(), &id);
    t.destroy(&ctx()).await.unwrap();
}

#[test]
fn a_pool_out_of_bounds_is_refused_naming_its_environment() {
    let e = TransportConfig::from_toml(&format!("{ONE}pool = 65\n")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
    assert!(e.message().contains("environments.sandbox.pool"), "{e}");
}
