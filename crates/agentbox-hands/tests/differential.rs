//! HostEnv and BoxEnv give the same values and error codes for the same operations: random
//! sequences run against both, on local, namespace, Docker and Daytona boxes (the last in the
//! repository's fake Daytona), each with and without its runner, and on a local box made a box
//! without live processes (`agentbox_testing::one_call::OneCall`, as Archil's are).
//!
//! Such a box takes no variables for one command, so on it (and on the host it is held to) a
//! command's locale is set in the command's own text rather than as a per-call variable; every
//! operation applies to it, none is left out.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agentbox_core::{Ctx, Provider, Sandbox, Spec};
use agentbox_hands::{BoxEnv, Command, ExecOptions, ExecutionEnv, FileInfo, FsError, HostEnv};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_providers::{LocalOptions, LocalProvider};
use proptest::prelude::*;

#[path = "common/protocol_2.rs"]
mod common_protocol_2;
use common_protocol_2::protocol_2_box;

#[derive(Clone, Debug)]
enum Op {
    Write(String, Vec<u8>),
    Append(String, Vec<u8>),
    ReadText(String),
    ReadBinary(String),
    ReadLines(String, Option<usize>),
    Info(String),
    List(String),
    Exists(String),
    Mkdir(String, bool),
    Remove(String, bool, bool),
    Rename(String, String),
    Truncate(String, u64),
    Canonical(String),
    ReadLink(String),
    Reader(String, bool),
    Symlink(String, String),
    Shell(String),
    /// Three commands at once, each on its own file.
    Concurrent(u8),
}

fn name() -> impl Strategy<Value = String> {
    // Never `..`, never absolute: HostEnv is this machine with no confinement, so a case must
    // not be able to name anything outside its own directory.
    prop_oneof![
        Just("a"),
        Just("b"),
        Just("dir"),
        Just("é ✓"),
        Just("sp ace"),
        Just(".hidden"),
        Just(".")
    ]
    .prop_map(String::from)
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(name(), 1..4).prop_map(|v| v.join("/"))
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"line one\nline two\n\nlast".to_vec()),
        Just(b"\r\nwindows\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..64),
        (1usize..3).prop_map(|n| vec![b'x'; n * 200_000]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (path(), bytes()).prop_map(|(p, b)| Op::Write(p, b)),
        1 => (path(), bytes()).prop_map(|(p, b)| Op::Append(p, b)),
        2 => path().prop_map(Op::ReadText),
        1 => path().prop_map(Op::ReadBinary),
        1 => (path(), prop::option::of(0usize..4)).prop_map(|(p, n)| Op::ReadLines(p, n)),
        2 => path().prop_map(Op::Info),
        2 => prop_oneof![Just(".".to_string()), path()].prop_map(Op::List),
        1 => path().prop_map(Op::Exists),
        2 => (path(), any::<bool>()).prop_map(|(p, r)| Op::Mkdir(p, r)),
        2 => (path(), any::<bool>(), any::<bool>()).prop_map(|(p, r, f)| Op::Remove(p, r, f)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (path(), 0u64..100).prop_map(|(p, n)| Op::Truncate(p, n)),
        1 => path().prop_map(Op::Canonical),
        1 => path().prop_map(Op::ReadLink),
        1 => (path(), any::<bool>()).prop_map(|(p, nf)| Op::Reader(p, nf)),
        1 => (prop_oneof![path(), Just("missing-target".to_string())], path()).prop_map(|(t, p)| Op::Symlink(t, p)),
        1 => prop_oneof![
            Just("printf 'w\\377x' > \"$(printf 'bad\\377name')\"; echo made".to_string()),
            Just("ls -1A | sort | head -c 2000; exit 3".to_string()),
            Just("echo out; echo err >&2; kill -TERM $$".to_string()),
        ]
        .prop_map(Op::Shell),
        1 => any::<u8>().prop_map(Op::Concurrent),
    ]
}

/// What an operation gave, with the environment's own cwd written as `<cwd>`.
#[derive(Debug, PartialEq)]
enum Got {
    Unit,
    Bool(bool),
    Text(String),
    Bytes(Vec<u8>),
    Lines(Vec<String>),
    Info(String, agentbox_hands::FileKind, u64),
    List(Vec<(String, agentbox_hands::FileKind, u64)>),
    Exec(i32, String),
    Err(agentbox_hands::FsCode),
    ExecErr(agentbox_hands::ExecCode),
}

fn info(i: FileInfo, cwd: &str) -> Got {
    // Times differ between two writes; a directory's size is the file system's own.
    let size = if i.kind == agentbox_hands::FileKind::Directory {
        0
    } else {
        i.size
    };
    Got::Info(i.path.replace(cwd, "<cwd>"), i.kind, size)
}

/// How a command gets the locale both sides share: as a per-call variable, or (for a box that
/// takes none) in its own text.
#[derive(Clone, Copy)]
enum Vars {
    PerCall,
    InCommand,
}

async fn apply(env: &dyn ExecutionEnv, op: &Op, vars: Vars) -> Got {
    let ctx = Ctx::background();
    let cwd = env.cwd();
    let r = |x: Result<Got, FsError>| x.unwrap_or_else(|e| Got::Err(e.code));
    match op {
        Op::Write(p, b) => r(env.write_file(p, b, &ctx).await.map(|_| Got::Unit)),
        Op::Append(p, b) => r(env.append_file(p, b, &ctx).await.map(|_| Got::Unit)),
        Op::ReadText(p) => r(env.read_text_file(p, &ctx).await.map(Got::Text)),
        Op::ReadBinary(p) => r(env.read_binary_file(p, &ctx).await.map(Got::Bytes)),
        Op::ReadLines(p, n) => r(env.read_text_lines(p, *n, &ctx).await.map(Got::Lines)),
        Op::Info(p) => r(env.file_info(p, &ctx).await.map(|i| info(i, &cwd))),
        Op::List(p) => r(env.list_dir(p, &ctx).await.map(|l| {
            Got::List(
                l.into_iter()
                    .map(|i| {
                        let size = if i.kind == agentbox_hands::FileKind::Directory {
                            0
                        } else {
                            i.size
                        };
                        (i.name, i.kind, size)
                    })
                    .collect(),
            )
        })),
        Op::Exists(p) => r(env.exists(p, &ctx).await.map(Got::Bool)),
        Op::Mkdir(p, rec) => r(env.create_dir(p, *rec, &ctx).await.map(|_| Got::Unit)),
        Op::Remove(p, rec, f) => r(env.remove(p, *rec, *f, &ctx).await.map(|_| Got::Unit)),
        Op::Rename(a, b) => r(env.rename_file(a, b, &ctx).await.map(|_| Got::Unit)),
        Op::Truncate(p, n) => r(env.truncate_file(p, *n, &ctx).await.map(|_| Got::Unit)),
        Op::Canonical(p) => {
            let base = canon_cwd(env).await;
            r(env
                .canonical_path(p, &ctx)
                .await
                .map(|c| Got::Text(c.replace(&base, "<cwd>"))))
        }
        Op::ReadLink(p) => r(env.read_link(p, &ctx).await.map(Got::Text)),
        Op::Reader(p, nf) => r(env.open_binary_reader(p, *nf, &ctx).await.map(|rd| {
            let i = info(rd.info.clone(), &cwd);
            Got::Lines(vec![
                format!("{i:?}"),
                String::from_utf8_lossy(rd.read(1, 5)).into_owned(),
                rd.scan_lines().count().to_string(),
            ])
        })),
        Op::Symlink(t, p) => {
            let argv = vec!["ln".to_string(), "-s".into(), t.clone(), p.clone()];
            exec(env, Command::Argv(argv), vars).await
        }
        Op::Shell(s) => exec(env, Command::Shell(s.clone()), vars).await,
        Op::Concurrent(n) => {
            let c = |i: u8| {
                Command::Shell(format!(
                    "for j in 1 2 3; do echo {n}-{i}-$j >> conc-{i}; done; cat conc-{i}; exit {i}"
                ))
            };
            let (a, b, d) = tokio::join!(exec(env, c(0), vars), exec(env, c(1), vars), exec(env, c(2), vars));
            Got::Lines(vec![format!("{a:?}"), format!("{b:?}"), format!("{d:?}")])
        }
    }
}

async fn canon_cwd(env: &dyn ExecutionEnv) -> String {
    env.canonical_path(".", &Ctx::background())
        .await
        .unwrap_or_else(|_| env.cwd())
}

async fn exec(env: &dyn ExecutionEnv, cmd: Command, vars: Vars) -> Got {
    let out = Arc::new(Mutex::new(String::new()));
    let sink = out.clone();
    // The host's own variables are the host's: give both the same locale.
    let (cmd, env_vars) = match (vars, cmd) {
        (Vars::PerCall, cmd) => (cmd, [("LANG".to_string(), "C.UTF-8".to_string())].into()),
        (Vars::InCommand, Command::Shell(s)) => {
            (Command::Shell(format!("export LANG=C.UTF-8\n{s}")), Default::default())
        }
        (Vars::InCommand, Command::Argv(a)) => {
            let mut argv = vec!["env".to_string(), "LANG=C.UTF-8".into()];
            argv.extend(a);
            (Command::Argv(argv), Default::default())
        }
    };
    let opts = ExecOptions {
        env: env_vars,
        // A command that hangs is a failure naming its op, never a hung suite.
        timeout: Some(60.0),
        on_output: Some(Arc::new(move |t: &str, _| {
            sink.lock().unwrap().push_str(t);
            Ok(())
        })),
        ..Default::default()
    };
    match env.exec(cmd, opts, &Ctx::background()).await {
        Ok(o) => {
            let mut text = out.lock().unwrap().clone();
            // stdout and stderr interleave as they arrive: compare them as sorted lines.
            let mut lines: Vec<&str> = text.lines().collect();
            lines.sort();
            text = lines.join("\n");
            Got::Exec(o.exit_code, text)
        }
        Err(e) => Got::ExecErr(e.code),
    }
}

struct Boxes {
    rt: tokio::runtime::Runtime,
    local: Arc<dyn Sandbox>,
    local_runner: Arc<dyn Sandbox>,
    local_protocol_2: Arc<dyn Sandbox>,
    docker: Option<Arc<dyn Sandbox>>,
    docker_runner: Option<Arc<dyn Sandbox>>,
    namespace: Arc<dyn Sandbox>,
    namespace_runner: Arc<dyn Sandbox>,
    one_call: Arc<dyn Sandbox>,
    daytona: Option<Arc<dyn Sandbox>>,
    daytona_runner: Option<Arc<dyn Sandbox>>,
    _daytona: Option<agentbox_fakes::daytona::FakeDaytona>,
    archil: Option<Arc<dyn Sandbox>>,
    _archil: Option<agentbox_fakes::archil::FakeArchil>,
    modal: Option<Arc<dyn Sandbox>>,
    _modal: Option<agentbox_fakes::modal::FakeModal>,
    e2b: Option<Arc<dyn Sandbox>>,
    e2b_runner: Option<Arc<dyn Sandbox>>,
    _e2b: Option<agentbox_fakes::e2b::FakeE2B>,
    _home: tempfile::TempDir,
}

/// A fake Archil with a work disk and a box on it; `None` (loudly, or a panic under CI) where
/// this machine has no box rootfs.
async fn archil(spec: &Spec) -> Option<(agentbox_fakes::archil::FakeArchil, Arc<dyn Sandbox>)> {
    use agentbox_providers::archil::{ApiKey, ArchilOptions, ArchilProvider};
    let rootfs = agentbox_testing::services::rootfs("differential tests on an Archil box")?;
    let key = "archil-differential-fake-key";
    let fake = agentbox_fakes::archil::FakeArchil::start(agentbox_fakes::archil::FakeArchilOptions {
        rootfs: Some(rootfs.into()),
        api_key: key.into(),
        ..Default::default()
    })
    .await
    .expect("the fake Archil starts");
    let disk = fake.create_disk("differential").expect("the fake makes a disk");
    let p = ArchilProvider::new(ArchilOptions {
        base_url: fake.base_url(),
        s3_base_url: fake.s3_base_url(),
        api_key: Some(ApiKey::new(key)),
        disk: Some(disk),
        ..Default::default()
    })
    .unwrap();
    let b = p.create(spec, &Ctx::background()).await.unwrap();
    assert!(!b.facts().live_processes);
    Some((fake, b))
}

/// A fake Modal and a box in it; `None` (loudly, or a panic under CI) where this machine has
/// no box rootfs.
async fn modal(spec: &Spec) -> Option<(agentbox_fakes::modal::FakeModal, Arc<dyn Sandbox>)> {
    use agentbox_providers::modal::{ApiKey, ModalOptions, ModalProvider};
    let rootfs = agentbox_testing::services::rootfs("differential tests on a Modal box")?;
    let (id, secret) = ("ak-differential", "as-differential-fake-secret");
    let fake = agentbox_fakes::modal::FakeModal::start(agentbox_fakes::modal::FakeModalOptions {
        rootfs: Some(rootfs.into()),
        token_id: id.into(),
        token_secret: secret.into(),
        ..Default::default()
    })
    .await
    .expect("the fake Modal starts");
    let p = ModalProvider::new(ModalOptions {
        server_url: fake.url(),
        token_id: Some(id.into()),
        token_secret: Some(ApiKey::new(secret)),
        ..Default::default()
    })
    .unwrap();
    let b = p.create(spec, &Ctx::background()).await.unwrap();
    assert!(b.facts().live_processes && b.files().is_none());
    Some((fake, b))
}

/// A fake E2B and two boxes in it, without and with the runner; `None` (loudly, or a panic
/// under CI) where this machine has no box rootfs.
async fn e2b(spec: &Spec) -> Option<(agentbox_fakes::e2b::FakeE2B, Arc<dyn Sandbox>, Arc<dyn Sandbox>)> {
    use agentbox_providers::e2b::{ApiKey, E2bOptions, E2bProvider};
    let rootfs = agentbox_testing::services::rootfs("differential tests on an E2B box")?;
    let key = "e2b_differential_fake_key";
    let fake = agentbox_fakes::e2b::FakeE2B::start(agentbox_fakes::e2b::FakeE2BOptions {
        rootfs: Some(rootfs.into()),
        api_key: key.into(),
        ..Default::default()
    })
    .await
    .expect("the fake E2B starts");
    let opts = E2bOptions {
        api_url: fake.url(),
        sandbox_url: Some(fake.url()),
        api_key: Some(ApiKey::new(key)),
        workspace: "/workspace".into(),
        ..Default::default()
    };
    let plain = E2bProvider::new(opts.clone()).unwrap();
    let with_runner = E2bProvider::new(E2bOptions {
        runner: Some(agentbox_providers::helper::HelperCommand::discover().unwrap()),
        ..opts
    })
    .unwrap();
    let b = plain.create(spec, &Ctx::background()).await.unwrap();
    let br = with_runner.create(spec, &Ctx::background()).await.unwrap();
    assert!(b.files().is_none() && br.files().is_some());
    Some((fake, b, br))
}

/// A fake Daytona and two boxes in it, without and with the runner; `None` (loudly, or a
/// panic under CI) where this machine has no box rootfs.
async fn daytona(spec: &Spec) -> Option<(agentbox_fakes::daytona::FakeDaytona, Arc<dyn Sandbox>, Arc<dyn Sandbox>)> {
    use agentbox_providers::daytona::{ApiKey, DaytonaOptions, DaytonaProvider};
    let rootfs = agentbox_testing::services::rootfs("differential tests on a Daytona box")?;
    let key = "dtn_differential_fake_key";
    let fake = agentbox_fakes::daytona::FakeDaytona::start(agentbox_fakes::daytona::FakeDaytonaOptions {
        rootfs: Some(rootfs.into()),
        api_key: key.into(),
        index_lag: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .expect("the fake Daytona starts");
    let opts = DaytonaOptions {
        api_url: fake.api_url(),
        api_key: Some(ApiKey::new(key)),
        poll: Duration::from_millis(30),
        ..Default::default()
    };
    let plain = DaytonaProvider::new(opts.clone()).unwrap();
    let with_runner = DaytonaProvider::new(DaytonaOptions {
        runner: Some(agentbox_providers::helper::HelperCommand::discover().unwrap()),
        ..opts
    })
    .unwrap();
    let d = plain.create(spec, &Ctx::background()).await.unwrap();
    let dr = with_runner.create(spec, &Ctx::background()).await.unwrap();
    assert!(d.files().is_none() && dr.files().is_some());
    Some((fake, d, dr))
}

fn boxes() -> &'static Boxes {
    static B: OnceLock<Boxes> = OnceLock::new();
    B.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let home = tempfile::tempdir().unwrap();
        agentbox_testing::runner::ensure();
        let (local, local_runner, docker, docker_runner, namespace, namespace_runner, daytona) = rt.block_on(async {
            let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
            let mut with_runner = LocalOptions::at(home.path()).unwrap();
            with_runner.runner = true;
            let lrp = LocalProvider::new(with_runner).unwrap();
            // The boxes live for the test process; their lifetime ends them soon after it.
            let spec = Spec::new(Duration::from_secs(600));
            let local = lp.create(&spec, &Ctx::background()).await.unwrap();
            let local_runner = lrp.create(&spec, &Ctx::background()).await.unwrap();
            assert!(
                local_runner.files().is_some(),
                "a local box made with a runner serves its files"
            );
            let (docker, docker_runner) =
                if agentbox_testing::services::docker_available("differential tests on a Docker box") {
                    let dp = DockerProvider::new(DockerOptions::default()).await.unwrap();
                    let drp = DockerProvider::new(DockerOptions {
                        runner: Some(agentbox_providers::helper::HelperCommand::discover().unwrap()),
                        ..DockerOptions::default()
                    })
                    .await
                    .unwrap();
                    let d = dp.create(&spec, &Ctx::background()).await.unwrap();
                    let dr = drp.create(&spec, &Ctx::background()).await.unwrap();
                    assert!(dr.files().is_some(), "a Docker box made with a runner serves its files");
                    (Some(d), Some(dr))
                } else {
                    (None, None)
                };
            // Namespace boxes: file operations by programs in the box, and by its runner.
            let np = |runner_files| {
                NamespaceProvider::new(NamespaceOptions {
                    runner_files,
                    ..NamespaceOptions::at(home.path()).unwrap()
                })
                .unwrap()
            };
            let namespace = np(false).create(&spec, &Ctx::background()).await.unwrap();
            let namespace_runner = np(true).create(&spec, &Ctx::background()).await.unwrap();
            assert!(namespace.files().is_none() && namespace_runner.files().is_some());
            let daytona = daytona(&spec).await;
            (
                local,
                local_runner,
                docker,
                docker_runner,
                namespace,
                namespace_runner,
                daytona,
            )
        });
        // A box without live processes (as Archil's): each command one call that answers once it
        // ended, files by upload and download.
        let one_call: Arc<dyn Sandbox> = rt.block_on(async {
            let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
            let spec = Spec::new(Duration::from_secs(600));
            let b = lp.create(&spec, &Ctx::background()).await.unwrap();
            Arc::new(agentbox_testing::one_call::OneCall::new(b).unwrap())
        });
        let spec = Spec::new(Duration::from_secs(600));
        // A local box through a runner of protocol 2 alone (the seed's).
        let local_protocol_2 = rt.block_on(protocol_2_box(home.path(), &spec));
        let (fake_archil, archil) = match rt.block_on(archil(&spec)) {
            Some((f, b)) => (Some(f), Some(b)),
            None => (None, None),
        };
        let (fake_modal, modal) = match rt.block_on(modal(&spec)) {
            Some((f, b)) => (Some(f), Some(b)),
            None => (None, None),
        };
        let (fake_e2b, e2b, e2b_runner) = match rt.block_on(e2b(&spec)) {
            Some((f, b, br)) => (Some(f), Some(b), Some(br)),
            None => (None, None, None),
        };
        Boxes {
            rt,
            local,
            local_runner,
            docker,
            docker_runner,
            namespace,
            namespace_runner,
            one_call,
            local_protocol_2,
            daytona: daytona.as_ref().map(|d| d.1.clone()),
            daytona_runner: daytona.as_ref().map(|d| d.2.clone()),
            _daytona: daytona.map(|d| d.0),
            archil,
            _archil: fake_archil,
            modal,
            _modal: fake_modal,
            e2b,
            e2b_runner,
            _e2b: fake_e2b,
            _home: home,
        }
    })
}

static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Run `ops` on a fresh host directory and a fresh directory of the box; every result must
/// be the same.
fn same(b: &Arc<dyn Sandbox>, ops: &[Op]) -> Result<(), TestCaseError> {
    let rt = &boxes().rt;
    let host_dir = tempfile::tempdir().unwrap();
    let n = CASE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    rt.block_on(async {
        let host = HostEnv::new(host_dir.path().to_string_lossy()).unwrap();
        let base = BoxEnv::new(b.clone());
        let dir = format!("{}/case-{n}", base.cwd());
        base.create_dir(&dir, true, &Ctx::background()).await.unwrap();
        let boxed = BoxEnv::new(b.clone()).with_cwd(&dir);
        let vars = if b.facts().live_processes {
            Vars::PerCall
        } else {
            Vars::InCommand
        };
        for (i, op) in ops.iter().enumerate() {
            let limit = Duration::from_secs(180);
            let h = tokio::time::timeout(limit, apply(&host, op, vars)).await;
            prop_assert!(h.is_ok(), "op {} ({:?}) hung on the host", i, op);
            let x = tokio::time::timeout(limit, apply(&boxed, op, vars)).await;
            prop_assert!(x.is_ok(), "op {} ({:?}) hung in the box", i, op);
            let (h, x) = (h.unwrap(), x.unwrap());
            prop_assert_eq!(&h, &x, "op {} of {:?}: {:?}", i, ops, op);
        }
        let _ = base.remove(&dir, true, true, &Ctx::background()).await;
        Ok(())
    })
}

/// One differential test: `cases` runs of 1 to `ops` operations, each done on the host and on
/// the box `which` answers, their outcomes the same (`None`: a box this machine cannot have,
/// said loudly where it was made).
macro_rules! agree {
    ($(#[$doc:meta])* $name:ident, $which:expr, cases: $cases:expr, shrink: $shrink:expr, ops: $most:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: $cases, max_shrink_iters: $shrink, ..ProptestConfig::default() })]

            $(#[$doc])*
            #[test]
            fn $name(ops in prop::collection::vec(op(), 1..$most)) {
                if let Some(b) = $which {
                    same(b, &ops)?;
                }
            }
        }
    };
}

agree!(host_and_a_local_box_agree, Some(&boxes().local), cases: 48, shrink: 200, ops: 14);

agree!(host_and_a_docker_box_agree, boxes().docker.as_ref(), cases: 24, shrink: 100, ops: 12);

agree!(host_and_a_local_box_through_its_runner_agree, Some(&boxes().local_runner), cases: 48, shrink: 200, ops: 14);

agree!(host_and_a_docker_box_through_its_runner_agree, boxes().docker_runner.as_ref(), cases: 24, shrink: 100, ops: 12);

agree!(host_and_a_namespace_box_agree, Some(&boxes().namespace), cases: 32, shrink: 100, ops: 14);

agree!(host_and_a_namespace_box_through_its_runner_agree, Some(&boxes().namespace_runner), cases: 32, shrink: 100, ops: 14);

agree!(host_and_a_local_box_through_a_protocol_2_runner_agree, Some(&boxes().local_protocol_2), cases: 32, shrink: 100, ops: 14);

agree!(host_and_a_box_without_live_processes_agree, Some(&boxes().one_call), cases: 32, shrink: 100, ops: 14);

/// A rename onto the directory a link to it stands for: rename(2) does not follow the link, so
/// the two are not the same file (a script that compared them with `-ef` answered Ok here).
#[test]
fn a_rename_onto_the_target_of_a_link_is_not_of_the_same_file() {
    let ops = vec![
        Op::Symlink(".".into(), "dir".into()),
        Op::Rename("dir".into(), ".".into()),
    ];
    let b = boxes();
    for one in [&b.local, &b.namespace, &b.one_call]
        .into_iter()
        .chain(b.archil.as_ref())
        .chain(b.modal.as_ref())
        .chain(b.e2b.as_ref())
    {
        same(one, &ops).unwrap();
    }
}

agree!(
    /// An Archil exec box of the fake Archil: each command one exec call in a fresh namespace
    /// box over the disk's directory, files through the object API.
    host_and_an_archil_box_agree, boxes().archil.as_ref(), cases: 32, shrink: 100, ops: 14
);

agree!(
    /// A sandbox of the fake E2B: each operation a program through envd's process stream.
    host_and_an_e2b_box_agree, boxes().e2b.as_ref(), cases: 24, shrink: 100, ops: 12
);

agree!(
    /// A sandbox of the fake E2B through its runner, reached by the fake's proxy to its port.
    host_and_an_e2b_box_through_its_runner_agree, boxes().e2b_runner.as_ref(), cases: 24, shrink: 100, ops: 12
);

agree!(
    /// A sandbox of the fake Modal: each operation a program through its command router.
    host_and_a_modal_box_agree, boxes().modal.as_ref(), cases: 24, shrink: 100, ops: 12
);

agree!(host_and_a_daytona_box_agree, boxes().daytona.as_ref(), cases: 12, shrink: 50, ops: 10);

agree!(host_and_a_daytona_box_through_its_runner_agree, boxes().daytona_runner.as_ref(), cases: 24, shrink: 100, ops: 12);
