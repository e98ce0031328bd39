//! The faults suite: it breaks things on purpose, the way users meet them, repeats each, and
//! counts what survived. Every call that meets a fault must come back (a typed error or a
//! success) within its deadline; what was acknowledged (a run's commits, a file written whole)
//! must still be there; no box may outlive its lifetime; and the next operation after the fault
//! must work.
//!
//! `scripts/faults [--seed N] [--rounds N]` runs it and prints the table; CI runs a short
//! round with a fixed seed (`FAULTS_SEED`, `FAULTS_ROUNDS`; 1 and 2 by default). The seed
//! draws which fault each round meets, where, and when a process is killed; where a fault
//! lands among a call's requests, and a kill within a call's time, still depend on the
//! machine's timing, so a seed repeats a run's faults, not every byte of it.
//!
//! Families (each a row per provider it applies to; `FAULTS_ONLY=docker,api` runs some: holder,
//! maker, clock, runner, disk, serve, docker, api, lost):
//! - `api <status>`, `api stall`, `api stall mid-body`, `api drop`, `api truncate`,
//!   `api malformed`: the fake Daytona, E2B, Kubernetes, Modal and Archil answer one request of
//!   a box's life (made, used, ended) with a 5xx or 429, an answer stalled past the call's
//!   deadline before its head or mid-body, a connection dropped before the body, a body cut in
//!   half, a body that is not JSON or not protobuf (the fakes' fault switch,
//!   `agentbox_fakes::faults`); `api sandbox lost`: the vendor loses a sandbox while a command
//!   streams in it;
//! - `runner killed mid-stream`, `mid-write`, `mid-upload`: a local box's runner SIGKILLed
//!   while a program streams its output, or while a file is written or uploaded through it;
//! - `disk full: extract`, `pull`, `commit` (here), `snapshot`, `fork` (`faults/boxes.rs`): a
//!   small tmpfs fills during each (root only: it mounts);
//! - `box init killed`, `docker engine restarted` (`faults/boxes.rs`): a Docker box's pid 1
//!   killed, and the `dockerd` the tests run stopped and started, under a streaming command;
//! - `holder killed`: the process holding a run SIGKILLed at a seeded point of its work, then
//!   the run opened again by a new process;
//! - `maker killed`, `puller killed`, `serve killed mid-stream`, `deadline edited back` and
//!   `forward`, `host clock jumped back` and `forward` (`faults/processes.rs`): the CLI's own
//!   processes killed at seeded points, a box's record edited, the wall clock of a box's
//!   supervisor set back and forward.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Provider, Sandbox, Spec, finish};
use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
use agentbox_fakes::faults::{Fault, Faults, Rule};

// The families in files of their own (a test's root takes its modules from `tests/`).
#[path = "faults/boxes.rs"]
mod boxes;
#[path = "faults/processes.rs"]
mod processes;

const BIN: &str = env!("CARGO_BIN_EXE_agentbox");

/// How long one call of a round may take before it counts as hung: its own deadline, and
/// a margin for the machine.
const CALL_DEADLINE: Duration = Duration::from_secs(20);
const HUNG_AFTER: Duration = Duration::from_secs(45);
/// The lifetime of every box the rounds make: each must be gone past it.
const LIFETIME: Duration = Duration::from_secs(15);

/// How one round ended.
enum Outcome {
    Survived,
    /// The operation ended before the fault's point came: the round tested nothing (it is
    /// shown, and not counted as injected).
    Missed(String),
    Lost(String),
    Hung(String),
    Leaked(String),
}

#[derive(Default)]
struct Tally {
    rounds: u32,
    missed: u32,
    survived: u32,
    lost: u32,
    hung: u32,
    leaked: u32,
    why: Vec<String>,
}

/// Every row of the table, by fault and provider.
#[derive(Default)]
struct Report(BTreeMap<(String, String), Tally>);

impl Report {
    fn add(&mut self, fault: &str, provider: &str, o: Outcome) {
        let t = self.0.entry((fault.to_string(), provider.to_string())).or_default();
        t.rounds += 1;
        match o {
            Outcome::Survived => t.survived += 1,
            Outcome::Missed(w) => {
                t.missed += 1;
                t.why.push(format!("missed: {w}"));
            }
            Outcome::Lost(w) => {
                t.lost += 1;
                t.why.push(format!("lost: {w}"));
            }
            Outcome::Hung(w) => {
                t.hung += 1;
                t.why.push(format!("hung: {w}"));
            }
            Outcome::Leaked(w) => {
                t.leaked += 1;
                t.why.push(format!("leaked: {w}"));
            }
        }
    }

    /// A round already counted is found to have leaked (a box past its lifetime).
    fn leaked(&mut self, fault: &str, provider: &str, what: String) {
        let t = self.0.entry((fault.to_string(), provider.to_string())).or_default();
        t.survived = t.survived.saturating_sub(1);
        t.leaked += 1;
        t.why.push(format!("leaked: {what}"));
    }

    fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:<10} {:>6} {:>8} {:>5} {:>5} {:>6} {:>6}\n",
            "fault", "provider", "rounds", "survived", "lost", "hung", "leaked", "missed"
        );
        let (mut n, mut ok, mut lost, mut hung, mut leaked) = (0, 0, 0, 0, 0);
        for ((f, p), t) in &self.0 {
            s.push_str(&format!(
                "{f:<28} {p:<10} {:>6} {:>8} {:>5} {:>5} {:>6} {:>6}\n",
                t.rounds, t.survived, t.lost, t.hung, t.leaked, t.missed
            ));
            for w in &t.why {
                s.push_str(&format!("    {w}\n"));
            }
            n += t.rounds - t.missed;
            ok += t.survived;
            lost += t.lost;
            hung += t.hung;
            leaked += t.leaked;
        }
        s.push_str(&format!(
            "faults: {n} injected, {ok} survived, {lost} lost, {hung} hung, {leaked} leaked\n"
        ));
        s
    }

    fn clean(&self) -> bool {
        self.0.values().all(|t| t.lost == 0 && t.hung == 0 && t.leaked == 0)
    }
}

/// A seeded generator (xorshift): the same seed, the same draws.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Whether the family `name` runs: `FAULTS_ONLY` (comma-separated family names, as
/// `docker,api`: holder, maker, clock, runner, disk, serve, docker, api, lost) narrows the
/// suite to some; unset, every family runs.
fn only(name: &str) -> bool {
    match std::env::var("FAULTS_ONLY") {
        Ok(v) if !v.trim().is_empty() => v.split(',').any(|p| name.starts_with(p.trim())),
        _ => true,
    }
}

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `f`'s result, or `Err` when it did not come back within [`HUNG_AFTER`].
async fn guard<T>(what: &str, f: impl Future<Output = T>) -> Result<T, Outcome> {
    tokio::time::timeout(HUNG_AFTER, f)
        .await
        .map_err(|_| Outcome::Hung(format!("{what} did not come back within {}s", HUNG_AFTER.as_secs())))
}

fn argv(s: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), s.into()]
}

/// Run `script` in `b`; its stdout, or the error.
async fn sh(b: &dyn Sandbox, script: &str, ctx: &Ctx) -> agentbox_core::Result<String> {
    let p = b.exec(&argv(script), &ExecOptions::default(), ctx).await?;
    let out = finish(p, FinishOptions::default()).await?;
    Ok(out.stdout_text())
}

/// A box's whole life under whatever faults are set: made, a command run, a file read back,
/// ended. Any step may fail (typed); none may answer wrongly; each must come back.
async fn a_life(p: &Arc<dyn Provider>) -> Result<Option<String>, Outcome> {
    life(p, false).await
}

/// The life after a fault, every fault gone: each step must work.
async fn the_next_life(p: &Arc<dyn Provider>) -> Outcome {
    match life(p, true).await {
        Ok(Some(_)) => Outcome::Survived,
        Ok(None) => Outcome::Lost("after the fault, a create failed".into()),
        Err(o) => o,
    }
}

/// A life; with `strict`, a step that fails is a loss.
async fn life(p: &Arc<dyn Provider>, strict: bool) -> Result<Option<String>, Outcome> {
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let b = match guard("create", p.create(&Spec::new(LIFETIME), &ctx)).await? {
        Ok(b) => b,
        Err(_) => return Ok(None),
    };
    let id = b.id().to_string();
    match guard("exec", sh(&*b, "echo ok > f; cat f", &ctx)).await? {
        Ok(out) if out != "ok\n" => {
            return Err(Outcome::Lost(format!(
                "box {id}: a command answered {out:?}, not \"ok\\n\""
            )));
        }
        Err(e) if strict => return Err(Outcome::Lost(format!("box {id}: a command failed: {e}"))),
        _ => {}
    }
    match guard("download", b.download("f", 100, &ctx)).await? {
        Ok(bytes) if bytes != b"ok\n" => {
            return Err(Outcome::Lost(format!("box {id}: a download answered {bytes:?}")));
        }
        Err(e) if strict => return Err(Outcome::Lost(format!("box {id}: a download failed: {e}"))),
        _ => {}
    }
    // Ended when it can be; one the fault kept alive must end by its lifetime.
    match guard("destroy", b.destroy(&ctx)).await? {
        Err(e) if strict => Err(Outcome::Lost(format!("box {id}: its destroy failed: {e}"))),
        _ => Ok(Some(id)),
    }
}

/// How a vendor loses a sandbox: whether it was there.
type Lose = Box<dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// A [`Lose`] of a fake that loses a sandbox at once, by a plain call.
fn lose_at_once(f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Lose {
    Box::new(move |id| {
        let gone = f(&id);
        Box::pin(async move { gone })
    })
}

/// A fake whose sandboxes the rounds make, seen from outside.
struct Vendor {
    name: &'static str,
    provider: Arc<dyn Provider>,
    faults: Arc<Faults>,
    /// The routes a fault is put on (each round draws one), each met in every box's life.
    routes: &'static [&'static str],
    /// The sandboxes the fake still keeps alive (not deleted).
    live: Box<dyn Fn() -> Vec<String> + Send + Sync>,
    /// Whether a box past its lifetime ends only when a call looks at it (Archil's design: no
    /// timer), so the leak check lists the provider's boxes first.
    swept_by_list: bool,
    /// Lose a sandbox (by its id in `live`) behind the client's back, as the vendor's failure
    /// would; `None` where a vendor has no sandbox that runs between calls.
    lose: Option<Lose>,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

async fn daytona(rootfs: &str, seed: u64) -> Vendor {
    let faults = Faults::new(seed);
    let fake = FakeDaytona::start(FakeDaytonaOptions {
        rootfs: Some(rootfs.into()),
        api_key: "faults-key".into(),
        minute: Duration::from_secs(1),
        index_lag: Duration::from_millis(100),
        delete_lag: Duration::from_millis(100),
        faults: Some(faults.clone()),
        ..Default::default()
    })
    .await
    .expect("the fake Daytona starts");
    let opts = agentbox_providers::daytona::DaytonaOptions {
        api_url: fake.api_url(),
        api_key: Some(agentbox_providers::daytona::ApiKey::new("faults-key")),
        minute: Duration::from_secs(1),
        index_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        start_timeout: Duration::from_secs(15),
        poll: Duration::from_millis(50),
        silent: Duration::from_secs(10),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(agentbox_providers::daytona::DaytonaProvider::new(opts).unwrap());
    let fake = Arc::new(fake);
    let view = fake.clone();
    Vendor {
        name: "daytona",
        provider,
        faults,
        routes: &["/api/sandbox", "/toolbox/"],
        live: Box::new(move || {
            view.sandboxes()
                .into_iter()
                .filter(|s| s.desired_state != "destroyed")
                .map(|s| s.id)
                .collect()
        }),
        swept_by_list: false,
        lose: Some({
            let fake = fake.clone();
            Box::new(move |id| {
                let fake = fake.clone();
                Box::pin(async move { fake.lose(&id).await })
            })
        }),
        _keep: Box::new(fake),
    }
}

async fn e2b(rootfs: &str, seed: u64) -> Vendor {
    let faults = Faults::new(seed);
    let fake = FakeE2B::start(FakeE2BOptions {
        rootfs: Some(rootfs.into()),
        api_key: "faults-key".into(),
        keepalive: Duration::from_secs(1),
        faults: Some(faults.clone()),
        ..Default::default()
    })
    .await
    .expect("the fake E2B starts");
    let opts = agentbox_providers::e2b::E2bOptions {
        api_url: fake.url(),
        sandbox_url: Some(fake.url()),
        api_key: Some(agentbox_providers::e2b::ApiKey::new("faults-key")),
        workspace: "/workspace".into(),
        keepalive: Duration::from_secs(1),
        request_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(agentbox_providers::e2b::E2bProvider::new(opts).unwrap());
    let fake = Arc::new(fake);
    let view = fake.clone();
    Vendor {
        name: "e2b",
        provider,
        faults,
        routes: &["/sandboxes", "/process.", "/files"],
        live: Box::new(move || view.sandboxes().into_iter().map(|(id, _)| id).collect()),
        swept_by_list: false,
        lose: Some(lose_at_once({
            let fake = fake.clone();
            move |id| fake.vanish(id)
        })),
        _keep: Box::new(fake),
    }
}

async fn kube(rootfs: &str, seed: u64) -> Vendor {
    use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
    let faults = Faults::new(seed);
    let fake = FakeKube::start(FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        faults: Some(faults.clone()),
        ..Default::default()
    })
    .await
    .expect("the fake Kubernetes API server starts");
    let opts = agentbox_providers::kube::KubeOptions {
        kubeconfig: Some(fake.kubeconfig().to_path_buf()),
        start_timeout: Duration::from_secs(15),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(
        agentbox_providers::kube::KubeProvider::new(opts)
            .await
            .expect("the kubeconfig reads"),
    );
    let fake = Arc::new(fake);
    let view = fake.clone();
    Vendor {
        name: "kube",
        provider,
        faults,
        routes: &["/api/v1/namespaces/default/pods", "/apis/"],
        // A pod whose box still runs: one past its activeDeadlineSeconds has none.
        live: Box::new(move || {
            view.pods()
                .into_iter()
                .filter(|p| p.has_box)
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect()
        }),
        swept_by_list: false,
        lose: Some({
            let fake = fake.clone();
            Box::new(move |id| {
                let fake = fake.clone();
                Box::pin(async move {
                    let (ns, name) = id.split_once('/').unwrap_or(("default", &id));
                    fake.evict(ns, name).await
                })
            })
        }),
        _keep: Box::new(fake),
    }
}

async fn modal(rootfs: &str, seed: u64) -> Vendor {
    use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
    let faults = Faults::new(seed);
    let (id, secret) = ("ak-faults", "as-faults-secret");
    let fake = FakeModal::start(FakeModalOptions {
        rootfs: Some(rootfs.into()),
        token_id: id.into(),
        token_secret: secret.into(),
        faults: Some(faults.clone()),
        ..Default::default()
    })
    .await
    .expect("the fake Modal starts");
    let opts = agentbox_providers::modal::ModalOptions {
        server_url: fake.url(),
        token_id: Some(id.into()),
        token_secret: Some(agentbox_providers::modal::ApiKey::new(secret)),
        connect_timeout: Duration::from_secs(5),
        create_timeout: Duration::from_secs(15),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(agentbox_providers::modal::ModalProvider::new(opts).unwrap());
    let fake = Arc::new(fake);
    let view = fake.clone();
    Vendor {
        name: "modal",
        provider,
        faults,
        routes: &[
            "/modal.client.ModalClient/",
            "/modal.task_command_router.TaskCommandRouter/",
        ],
        live: Box::new(move || {
            view.sandboxes()
                .into_iter()
                .filter(|(_, ended)| !ended)
                .map(|(id, _)| id)
                .collect()
        }),
        swept_by_list: false,
        lose: Some(lose_at_once({
            let fake = fake.clone();
            move |id| fake.end_sandbox(id)
        })),
        _keep: Box::new(fake),
    }
}

async fn archil(rootfs: &str, seed: u64) -> Vendor {
    use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
    let faults = Faults::new(seed);
    let key = "archil-faults-key";
    let fake = FakeArchil::start(FakeArchilOptions {
        rootfs: Some(rootfs.into()),
        api_key: key.into(),
        faults: Some(faults.clone()),
        ..Default::default()
    })
    .await
    .expect("the fake Archil starts");
    let disk = fake.create_disk("faults").expect("the fake makes a disk");
    let opts = agentbox_providers::archil::ArchilOptions {
        base_url: fake.base_url(),
        s3_base_url: fake.s3_base_url(),
        api_key: Some(agentbox_providers::archil::ApiKey::new(key)),
        disk: Some(disk.clone()),
        request_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(agentbox_providers::archil::ArchilProvider::new(opts).unwrap());
    // A box lives as its record on the disk, seen here from outside.
    let records = fake.disk_dir(&disk).join("boxes.records");
    Vendor {
        name: "archil",
        provider,
        faults,
        routes: &["/api/", "/s3/"],
        live: Box::new(move || {
            std::fs::read_dir(&records)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        }),
        swept_by_list: true,
        // Each command is its own short-lived container: nothing runs between calls to lose.
        lose: None,
        _keep: Box::new(fake),
    }
}

/// How long an answer is stalled: past the provider's deadline for one request.
const STALL: Duration = Duration::from_secs(8);

/// The vendor API's faults, `rounds` of each on each vendor.
async fn api_faults(report: &mut Report, vendors: &[Vendor], rounds: u64, rng: &mut Rng) {
    let faults = [
        Fault::Status(500),
        Fault::Status(502),
        Fault::Status(503),
        Fault::Status(429),
        Fault::Stall(STALL),
        Fault::StallBody(STALL),
        Fault::Drop,
        Fault::Truncate,
        Fault::Malformed,
    ];
    // Boxes a round left alive, which must be gone once their lifetime has passed.
    let mut left: Vec<(String, &Vendor, String)> = Vec::new();
    for v in vendors {
        for fault in &faults {
            let label = format!("api {}", fault.name());
            for _ in 0..rounds {
                let first = rng.below(v.routes.len() as u64) as usize;
                let before = (v.live)();
                let injected = v.faults.injected();
                // Each matching request meets it by an even draw, once: somewhere in the life.
                let route = v.routes[first];
                v.faults
                    .add(Rule::on("*", route, fault.clone()).times(1).probability(0.5));
                let mut life = a_life(&v.provider).await;
                // The draws spared the whole life: the next one meets it at its first match,
                // on this route and then the others (a malformed answer waits for a JSON one).
                for k in 0..v.routes.len() {
                    if life.is_err() || v.faults.injected() > injected {
                        break;
                    }
                    v.faults.clear();
                    let route = v.routes[(first + k) % v.routes.len()];
                    v.faults.add(Rule::on("*", route, fault.clone()).times(1));
                    life = a_life(&v.provider).await;
                }
                v.faults.clear();
                let outcome = match life {
                    Err(o) => o,
                    Ok(_) if v.faults.injected() == injected => Outcome::Lost(format!(
                        "no request of a box's life met the fault on any of {:?}: the round tested nothing",
                        v.routes
                    )),
                    // The next life, faults gone, must go through.
                    Ok(_) => the_next_life(&v.provider).await,
                };
                for id in (v.live)() {
                    if !before.contains(&id) {
                        left.push((label.clone(), v, id));
                    }
                }
                report.add(&label, v.name, outcome);
            }
        }
    }
    // Past the lifetime (after the longest stall, which may make a box late, and the fakes'
    // clocks' tick), nothing a round made is alive.
    tokio::time::sleep(STALL + LIFETIME + Duration::from_secs(5)).await;
    for v in vendors.iter().filter(|v| v.swept_by_list) {
        let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
        let _ = v.provider.list(&Default::default(), &ctx).await;
    }
    for (label, v, id) in left {
        if (v.live)().contains(&id) {
            report.leaked(&label, v.name, format!("sandbox {id} alive past its lifetime"));
        }
    }
    for v in vendors {
        for id in (v.live)() {
            report.add(
                "api (a late box)",
                v.name,
                Outcome::Leaked(format!("sandbox {id} alive past its lifetime")),
            );
        }
    }
}

/// A sandbox lost behind the client's back while a command streams in it: the command's call
/// ends typed, the lost box answers nothing as if it were alive, and the next life works.
async fn lost_faults(report: &mut Report, vendors: &[Vendor], rounds: u64, rng: &mut Rng) {
    let fault = "api sandbox lost";
    for v in vendors {
        let Some(lose) = &v.lose else { continue };
        for _ in 0..rounds {
            let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
            let before = (v.live)();
            let b = match guard("create", v.provider.create(&Spec::new(LIFETIME), &ctx)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    report.add(
                        fault,
                        v.name,
                        Outcome::Lost(format!("a create with no fault failed: {e}")),
                    );
                    continue;
                }
                Err(o) => {
                    report.add(fault, v.name, o);
                    continue;
                }
            };
            let made: Vec<String> = (v.live)().into_iter().filter(|id| !before.contains(id)).collect();
            let [id] = &made[..] else {
                report.add(
                    fault,
                    v.name,
                    Outcome::Lost(format!("the create made {made:?}, not one sandbox")),
                );
                continue;
            };
            let delay = Duration::from_millis(300 + rng.below(700));
            let call = async {
                let p = b
                    .exec(
                        &argv("while :; do echo tick; sleep 0.05; done"),
                        &ExecOptions::default(),
                        &ctx,
                    )
                    .await?;
                finish(p, FinishOptions::default()).await
            };
            let lost = async {
                tokio::time::sleep(delay).await;
                lose(id.clone()).await
            };
            let outcome = match guard(fault, async { tokio::join!(call, lost) }).await {
                Err(o) => o,
                Ok((_, false)) => Outcome::Lost(format!("the fake had no sandbox {id} to lose")),
                // Ended by the loss: a killed program's status is a true answer, an exit 0 is not.
                Ok((Ok(f), true)) if f.status.code == 0 => Outcome::Lost(format!(
                    "an endless command in a lost sandbox exited 0 ({} bytes)",
                    f.stdout.len()
                )),
                Ok((_, true)) => match guard("an exec in the lost box", sh(&*b, "echo ok", &ctx)).await {
                    Err(o) => o,
                    Ok(Ok(out)) => Outcome::Lost(format!("the lost sandbox {id} still answered {out:?}")),
                    Ok(Err(_)) => the_next_life(&v.provider).await,
                },
            };
            let _ = guard("destroy", b.destroy(&ctx)).await;
            let outcome = match outcome {
                Outcome::Survived if (v.live)().contains(id) => {
                    Outcome::Leaked(format!("the lost sandbox {id} is still alive"))
                }
                o => o,
            };
            report.add(fault, v.name, outcome);
        }
    }
}

/// The pids whose command line holds `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn kill9(pid: i32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// What a `runner killed` round does while its runner is killed: stream a program's output,
/// write a file through the box's file system, or upload one.
async fn runner_call(kind: &str, b: &dyn Sandbox, big: &[u8], ctx: &Ctx) -> agentbox_core::Result<()> {
    if kind.ends_with("stream") {
        sh(b, "i=0; while [ $i -lt 300000 ]; do echo line$i; i=$((i+1)); done", ctx)
            .await
            .map(|_| ())
    } else if kind.ends_with("upload") {
        b.upload("big.bin", big, ctx).await
    } else {
        // A write through the box's file system (what an agent's write tool does), over a
        // file that was there.
        let files = b.files().expect("a runner box has files");
        let ws = b.facts().workspace.clone().unwrap_or_default();
        let path = format!("{ws}/big.bin");
        let failed = |e| agentbox_core::Error::unknown(format!("writing {path}: {e}"));
        files.write(&path, b"old", false, ctx).await.map_err(failed)?;
        files.write(&path, big, false, ctx).await.map_err(failed)
    }
}

/// A local box's runner SIGKILLed mid-stream, mid-write and mid-upload: the call comes back typed, a file
/// written is whole or not there, and the box (its runner started again) serves the next call.
async fn runner_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    let big: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let mut opts = agentbox_providers::LocalOptions::at(home.path()).unwrap();
    opts.runner = true;
    let p: Arc<dyn Provider> = Arc::new(agentbox_providers::LocalProvider::new(opts).unwrap());
    for kind in [
        "runner killed mid-stream",
        "runner killed mid-write",
        "runner killed mid-upload",
    ] {
        // The call once with no fault: how long it takes on this machine.
        let took = {
            let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
            let b = p.create(&Spec::new(LIFETIME), &ctx).await.unwrap();
            let start = std::time::Instant::now();
            runner_call(kind, &*b, &big, &ctx)
                .await
                .unwrap_or_else(|e| panic!("{kind}: the call with no fault failed: {e}"));
            let took = start.elapsed();
            let _ = b.destroy(&ctx).await;
            took.max(Duration::from_millis(1))
        };
        for _ in 0..rounds {
            let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
            let b = p.create(&Spec::new(LIFETIME), &ctx).await.unwrap();
            let sock = home.path().join("boxes").join(b.id().name()).join("runner.sock");
            let runner = pids_with(&sock.to_string_lossy());
            if runner.is_empty() {
                report.add(
                    kind,
                    "local",
                    Outcome::Lost(format!("box {}: no runner process found to kill", b.id())),
                );
                continue;
            }
            // A point within the call, as long as it takes here.
            let delay = Duration::from_millis(rng.below(took.as_millis() as u64));
            let call = runner_call(kind, &*b, &big, &ctx);
            let kill = async {
                tokio::time::sleep(delay).await;
                for pid in &runner {
                    kill9(*pid);
                }
                // The box's runner is started again, as a host that attaches does.
                tokio::time::sleep(Duration::from_millis(100)).await;
                p.attach(b.id(), &ctx).await
            };
            let (ran, again) = match guard(kind, async { tokio::join!(call, kill) }).await {
                Ok(r) => r,
                Err(o) => {
                    report.add(kind, "local", o);
                    continue;
                }
            };
            let outcome = match again {
                Ok(Some(again)) => {
                    let ws = again.facts().workspace.clone().unwrap_or_default();
                    let file = Path::new(&ws).join("big.bin");
                    let acknowledged = ran.is_ok() && !kind.ends_with("stream");
                    match std::fs::read(&file) {
                        // A write the call said was done is there, whole.
                        Ok(got) if acknowledged && got != big => Outcome::Lost(format!(
                            "big.bin is {} bytes after a write of {} that was acknowledged",
                            got.len(),
                            big.len()
                        )),
                        Err(e) if acknowledged => {
                            Outcome::Lost(format!("big.bin is gone after a write that was acknowledged: {e}"))
                        }
                        // Not there, or whole: never a part where a whole file was promised.
                        Ok(got) if got != big && got != b"old" => {
                            Outcome::Lost(format!("big.bin is {} bytes of the {} written", got.len(), big.len()))
                        }
                        _ => match guard("the next exec", sh(&*again, "echo ok", &ctx)).await {
                            Ok(Ok(o)) if o == "ok\n" => Outcome::Survived,
                            Ok(Ok(o)) => Outcome::Lost(format!("the next exec answered {o:?}")),
                            Ok(Err(e)) => Outcome::Lost(format!("the next exec failed: {e}")),
                            Err(o) => o,
                        },
                    }
                }
                Ok(None) => Outcome::Lost("the box was gone after its runner was killed".into()),
                Err(e) => Outcome::Lost(format!("the box could not be reached again: {e}")),
            };
            let _ = b.destroy(&ctx).await;
            report.add(kind, "local", outcome);
        }
    }
}

/// A tmpfs of `size` at a new directory, unmounted when dropped (then its directory goes).
struct Tmpfs {
    at: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("fs");
        std::fs::create_dir(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs at {}", at.display());
        Tmpfs { at, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily when busy (a round that failed may leave a box's process on it): never left
        // mounted under a directory about to be removed.
        let unmounted = Command::new("umount").arg(&self.at).status().is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

/// Fill `dir` but for about `room` bytes.
fn fill(dir: &Path, room: u64) {
    let st = rustix::fs::statvfs(dir).unwrap();
    let free = st.f_bavail * st.f_frsize;
    let n = free.saturating_sub(room);
    std::fs::write(dir.join("filler"), vec![0u8; n as usize]).unwrap();
}

/// Whether this process may mount the tmpfs a disk family needs (root); CI, which runs as
/// root, never skips: elsewhere the family says it did not run.
fn can_mount(family: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the disk faults mount a tmpfs, which needs root: CI runs as root"
    );
    eprintln!("faults: skipping the {family} faults: mounting a tmpfs needs root");
    false
}

/// The disk filling under an extraction, a pull and a run's commits.
async fn disk_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    if !can_mount("disk") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let p = agentbox_providers::LocalProvider::new(agentbox_providers::LocalOptions::at(home.path()).unwrap()).unwrap();
    for _ in 0..rounds {
        let size = (1 + rng.below(3)) << 20;
        let big: Vec<u8> = (0..size as u32).map(|i| (i % 253) as u8).collect();

        // A pull into a disk that fills: the file is whole or as it was; the mark leaves it
        // to fetch again; with room again, the next pull brings it.
        let fs = Tmpfs::new("8m");
        let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
        let b = p.create(&Spec::new(LIFETIME), &ctx).await.unwrap();
        let ws = b.facts().workspace.clone().unwrap();
        std::fs::write(Path::new(&ws).join("big.bin"), &big).unwrap();
        std::fs::write(fs.at.join("big.bin"), b"old").unwrap();
        fill(&fs.at, size / 2);
        let pull = agentbox_sync::PullOptions {
            from: ".".into(),
            to: fs.at.clone(),
            ..Default::default()
        };
        let outcome = match guard("pull", agentbox_sync::pull_dir(&*b, &pull, &ctx)).await {
            Err(o) => o,
            Ok(first) => {
                let now = std::fs::read(fs.at.join("big.bin")).unwrap_or_default();
                if now != b"old" && now != big {
                    Outcome::Lost(format!("big.bin is {} bytes, neither the old nor the new", now.len()))
                } else {
                    std::fs::remove_file(fs.at.join("filler")).unwrap();
                    let since = first.ok().map(|f| f.mark);
                    let again = agentbox_sync::PullOptions { since, ..pull.clone() };
                    match agentbox_sync::pull_dir(&*b, &again, &ctx).await {
                        Ok(_) if std::fs::read(fs.at.join("big.bin")).unwrap_or_default() == big => Outcome::Survived,
                        Ok(_) => Outcome::Lost("with room again, the next pull did not bring big.bin".into()),
                        Err(e) => Outcome::Lost(format!("with room again, the next pull failed: {e}")),
                    }
                }
            }
        };
        report.add("disk full: pull", "local", outcome);

        // An extraction into a disk that fills: no partial file where a whole one was promised.
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("big.bin"), &big).unwrap();
        let tar = Command::new("tar")
            .args(["-cf", "-", "-C"])
            .arg(src.path())
            .arg("big.bin")
            .output()
            .unwrap()
            .stdout;
        let fs2 = Tmpfs::new("8m");
        std::fs::write(fs2.at.join("big.bin"), b"old").unwrap();
        fill(&fs2.at, size / 2);
        let receipt = agentbox_sync::extract(&tar[..], &fs2.at, &agentbox_sync::Options::default());
        let now = std::fs::read(fs2.at.join("big.bin")).unwrap_or_default();
        let outcome = if now != b"old" && now != big {
            Outcome::Lost(format!("big.bin is {} bytes after the extraction", now.len()))
        } else if now == b"old" && receipt.stopped.is_none() && receipt.skips.is_empty() {
            Outcome::Lost("the extraction said nothing of the file it did not write".into())
        } else {
            Outcome::Survived
        };
        report.add("disk full: extract", "local", outcome);
        let _ = b.destroy(&ctx).await;

        // A run's store commits until the disk is full: every acknowledged one is there after.
        let fs3 = Tmpfs::new("4m");
        let runs = agentbox_runs::Runs::new(&fs3.at);
        runs.create(Some("full")).unwrap();
        let outcome = match runs.open("full").await {
            Err(e) => Outcome::Lost(format!("the run did not open: {e}")),
            Ok(run) => {
                fill(&fs3.at, (64 + rng.below(512)) << 10);
                let mut kept = Vec::new();
                let text = "x".repeat(8 << 10);
                for _ in 0..2000 {
                    match run.store().append("user", &serde_json::json!({ "text": text })) {
                        Ok(seq) => kept.push(seq),
                        Err(_) => break,
                    }
                }
                drop(run);
                std::fs::remove_file(fs3.at.join("filler")).unwrap();
                match runs.open("full").await {
                    Err(e) => Outcome::Lost(format!("with room again, the run did not open: {e}")),
                    Ok(run) => {
                        let have: Vec<i64> = run.store().messages().unwrap().iter().map(|m| m.seq).collect();
                        let gone: Vec<&i64> = kept.iter().filter(|s| !have.contains(s)).collect();
                        let _ = run.release().await;
                        if gone.is_empty() {
                            Outcome::Survived
                        } else {
                            Outcome::Lost(format!("acknowledged commits {gone:?} are gone"))
                        }
                    }
                }
            }
        };
        report.add("disk full: commit", "local", outcome);
    }
}

/// The process holding a run SIGKILLed at a seeded point; a new process opens it again: every
/// message the holder was told is durable is there, and the run goes on.
fn holder_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    for round in 0..rounds {
        let home = tempfile::tempdir().unwrap();
        let root = home.path().to_string_lossy().into_owned();
        let id = format!("held-{round}");
        let new = Command::new(BIN)
            .args(["runs", "new", &id, "--root", &root])
            .env("AGENTBOX_HOME", &root)
            .output()
            .unwrap();
        assert!(new.status.success(), "{}", String::from_utf8_lossy(&new.stderr));
        let agent = |steps: &str| {
            let mut c = Command::new(BIN);
            c.args([
                "runs",
                "agent",
                &id,
                "--root",
                &root,
                "--steps",
                steps,
                "--step-time",
                "50ms",
            ])
            .args(["--claim-wait", "10s"])
            .env("AGENTBOX_HOME", &root)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
            c
        };
        let mut holder = agent("6").spawn().unwrap();
        let kill_after = 1 + rng.below(10) as usize;
        let mut acknowledged: Vec<i64> = Vec::new();
        for l in BufReader::new(holder.stdout.take().unwrap()).lines() {
            let Ok(l) = l else { break };
            if let Some(kept) = l.strip_prefix("kept ") {
                acknowledged.push(kept.split(' ').next().unwrap().parse().unwrap());
                if acknowledged.len() == kill_after {
                    let _ = holder.kill();
                    break;
                }
            }
        }
        let _ = holder.wait();
        let next = agent("6").output().unwrap();
        let store = agentbox_runs::Store::read(&home.path().join("runs").join(&id).join("store.db"));
        let outcome = match (next.status.success(), store.and_then(|s| s.messages())) {
            (false, _) => Outcome::Lost(format!(
                "the next process did not go on (exit {:?})",
                next.status.code()
            )),
            (true, Err(e)) => Outcome::Lost(format!("the store does not read: {e}")),
            (true, Ok(conv)) => {
                let gone: Vec<&i64> = acknowledged
                    .iter()
                    .filter(|s| !conv.iter().any(|m| m.seq == **s))
                    .collect();
                if gone.is_empty() {
                    Outcome::Survived
                } else {
                    Outcome::Lost(format!("acknowledged messages {gone:?} are gone"))
                }
            }
        };
        report.add("holder killed", "local", outcome);
    }
}

#[test]
fn faults_are_survived_and_counted() {
    let test = "faults_are_survived_and_counted";
    let seed = var("FAULTS_SEED", 1);
    let rounds = var("FAULTS_ROUNDS", 2);
    let mut rng = Rng::new(seed);
    let mut report = Report::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if only("holder") {
        holder_faults(&mut report, rounds, &mut rng);
    }
    if only("maker") {
        processes::maker_faults(&mut report, rounds, &mut rng);
    }
    if only("clock") {
        processes::clock_faults(&mut report, rounds, &mut rng);
    }
    rt.block_on(async {
        if only("runner") {
            runner_faults(&mut report, rounds, &mut rng).await;
        }
        if only("disk") {
            disk_faults(&mut report, rounds, &mut rng).await;
            boxes::snapshot_faults(&mut report, rounds, &mut rng).await;
        }
        if only("clock") {
            processes::host_clock_faults(&mut report, rounds, &mut rng).await;
        }
        if only("serve") {
            processes::serve_faults(&mut report, rounds, &mut rng).await;
        }
        if only("docker") {
            boxes::docker_faults(&mut report, rounds, &mut rng).await;
        }
        if (only("api") || only("lost"))
            && let Some(rootfs) = agentbox_testing::services::rootfs(test)
        {
            let vendors = vec![
                daytona(&rootfs, seed).await,
                e2b(&rootfs, seed).await,
                kube(&rootfs, seed).await,
                modal(&rootfs, seed).await,
                archil(&rootfs, seed).await,
            ];
            if only("api") {
                api_faults(&mut report, &vendors, rounds, &mut rng).await;
            }
            if only("lost") {
                lost_faults(&mut report, &vendors, rounds, &mut rng).await;
            }
        }
    });
    let table = report.table();
    println!("faults (seed {seed}, {rounds} rounds):\n{table}");
    if let Ok(f) = std::env::var("FAULTS_REPORT") {
        std::fs::write(f, &table).unwrap();
    }
    assert!(
        !report.0.is_empty(),
        "no fault was injected: FAULTS_ONLY names no family?"
    );
    assert!(report.clean(), "faults were not all survived:\n{table}");
}
