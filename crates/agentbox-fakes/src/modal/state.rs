//! What both services share: the records (environments, apps, images, secrets, sandboxes and
//! their tasks), the scripted faults, the log of calls, and the life of a sandbox's box and of
//! each exec in it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentbox_core::{ByteReader, Ctx, Killer, Provider, Sandbox, Stdin};
use agentbox_modal_proto::client::GenericResult;
use agentbox_modal_proto::client::generic_result::GenericStatus;
use agentbox_providers::namespace::NamespaceProvider;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::modal::RecordedCall;

/// How many calls the log keeps (the oldest let go).
const MAX_RECORDED: usize = 10_000;
/// The most one exec's stream keeps; past it the exec is killed and reads past it fail.
pub(crate) const MAX_OUTPUT: usize = 64 << 20;
/// How long a stream is still read once its program exited (a program it left in the
/// background may hold the pipe open).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);
/// How long making or ending a box may take.
pub(crate) const BOX_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `prefix` and 22 random letters and digits, as Modal's ids (`sb-` ids of that shape are
/// what the SDK takes for V1 sandboxes).
pub(crate) fn modal_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut b = [0u8; 22];
    let _ = getrandom::fill(&mut b);
    let mut s: String = b
        .iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect();
    // A task id ending in `V` is a V2 sandbox's to the SDK.
    if s.ends_with('V') {
        s.pop();
        s.push('v');
    }
    format!("{prefix}{s}")
}

pub(crate) fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A result of `status` with `exitcode` and `exception`.
pub(crate) fn result(status: GenericStatus, exitcode: i32, exception: &str) -> GenericResult {
    GenericResult {
        status: status as i32,
        exitcode,
        exception: exception.to_string(),
        ..Default::default()
    }
}

/// A fault scripted by [`crate::modal::FakeModal::fail_next`].
pub(crate) struct Fault {
    pub(crate) method: String,
    pub(crate) code: tonic::Code,
    pub(crate) message: String,
    pub(crate) left: usize,
}

pub(crate) struct App {
    pub(crate) tags: HashMap<String, String>,
}

pub(crate) struct Image {
    /// The Dockerfile commands it was asked with (none for a snapshot).
    pub(crate) commands: Vec<String>,
    /// The namespace provider's snapshot it starts from, for an image a snapshot made.
    pub(crate) snapshot: Option<String>,
}

#[derive(Default)]
pub(crate) struct Records {
    /// Environment name to its id.
    pub(crate) envs: BTreeMap<String, String>,
    pub(crate) apps: BTreeMap<String, App>,
    /// (environment, app name) to the app's id.
    pub(crate) app_names: BTreeMap<(String, String), String>,
    pub(crate) images: BTreeMap<String, Image>,
    pub(crate) secrets: BTreeMap<String, BTreeMap<String, String>>,
    /// Named secrets: (environment, name) to the id.
    pub(crate) secret_names: BTreeMap<(String, String), String>,
    pub(crate) sandboxes: BTreeMap<String, Arc<Sbx>>,
    /// Task id to sandbox id.
    pub(crate) tasks: BTreeMap<String, String>,
    /// Memory snapshots: id to (the app, the sandbox's definition with its image the files
    /// kept).
    pub(crate) memory_snapshots: BTreeMap<String, (String, agentbox_modal_proto::client::Sandbox)>,
    /// The newest sandbox's `created_at`: each is later than the one before (listings page by it).
    pub(crate) last_created: f64,
}

pub(crate) struct Shared {
    pub(crate) token_id: String,
    pub(crate) token_secret: String,
    pub(crate) rootfs: Option<PathBuf>,
    pub(crate) gpus: Vec<(String, Vec<String>)>,
    pub(crate) fuse: bool,
    pub(crate) list_page: usize,
    pub(crate) max_wait: Duration,
    /// `http://ADDR`, the command router's url.
    pub(crate) url: String,
    /// The fake's own directory (the GPU sandboxes' `nvidia-smi`).
    pub(crate) dir: PathBuf,
    pub(crate) provider: Arc<NamespaceProvider>,
    pub(crate) records: Mutex<Records>,
    pub(crate) faults: Mutex<Vec<Fault>>,
    /// `cut_stdio_after`: (bytes, streams left).
    pub(crate) cuts: Mutex<Option<(usize, usize)>>,
    pub(crate) calls: Mutex<VecDeque<RecordedCall>>,
}

impl Shared {
    /// Note a call and meet the first scripted fault for its method.
    pub(crate) fn enter(
        &self,
        method: &str,
        sandbox_id: Option<&str>,
        task_id: Option<&str>,
        exec_id: Option<&str>,
    ) -> Result<(), tonic::Status> {
        {
            let mut c = lock(&self.calls);
            if c.len() >= MAX_RECORDED {
                c.pop_front();
            }
            let some = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
            c.push_back(RecordedCall {
                method: method.to_string(),
                sandbox_id: some(sandbox_id),
                task_id: some(task_id),
                exec_id: some(exec_id),
            });
        }
        let mut f = lock(&self.faults);
        if let Some(i) = f.iter().position(|x| x.method == method) {
            let st = tonic::Status::new(f[i].code, f[i].message.clone());
            f[i].left -= 1;
            if f[i].left == 0 {
                f.remove(i);
            }
            return Err(st);
        }
        Ok(())
    }

    pub(crate) fn sandbox(&self, id: &str) -> Result<Arc<Sbx>, tonic::Status> {
        lock(&self.records)
            .sandboxes
            .get(id)
            .cloned()
            .ok_or_else(|| tonic::Status::not_found(format!("Sandbox {id} not found")))
    }

    /// The cut the next stdio read meets, if one is scripted.
    pub(crate) fn take_cut(&self) -> Option<usize> {
        let mut c = lock(&self.cuts);
        let (bytes, left) = (*c)?;
        if left <= 1 {
            *c = None;
        } else {
            *c = Some((bytes, left - 1));
        }
        Some(bytes)
    }

    /// End every sandbox's box (the fake shuts down), and any box of its provider left.
    pub(crate) async fn end_all(&self) {
        let all: Vec<Arc<Sbx>> = lock(&self.records).sandboxes.values().cloned().collect();
        let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
        for s in all {
            s.set_result(result(GenericStatus::Terminated, 137, "the fake Modal shut down"));
            let b = lock(&s.boxed).take();
            if let Some(b) = b {
                let _ = b.destroy(&ctx).await;
            }
        }
        if let Ok(left) = self.provider.list(&Default::default(), &ctx).await {
            for b in left {
                let _ = b.destroy(&ctx).await;
            }
        }
    }
}

/// One sandbox: its box while it runs, its result once it ended.
pub(crate) struct Sbx {
    pub(crate) id: String,
    pub(crate) app_id: String,
    pub(crate) task_id: String,
    pub(crate) jwt: String,
    pub(crate) created_at: f64,
    pub(crate) timeout_secs: u32,
    pub(crate) name: String,
    pub(crate) image_id: String,
    /// (port, unencrypted).
    pub(crate) ports: Vec<(u32, bool)>,
    pub(crate) workdir: Option<String>,
    pub(crate) gpu_type: String,
    pub(crate) tags: Mutex<Vec<(String, String)>>,
    pub(crate) boxed: Mutex<Option<Arc<dyn Sandbox>>>,
    pub(crate) result: watch::Sender<Option<GenericResult>>,
    pub(crate) execs: Mutex<HashMap<String, Arc<Exec>>>,
    /// What it was made from: a memory snapshot of it restores a sandbox of the same.
    pub(crate) definition: agentbox_modal_proto::client::Sandbox,
}

impl Sbx {
    pub(crate) fn result(&self) -> Option<GenericResult> {
        self.result.borrow().clone()
    }

    /// Set the result unless there is one; whether this call set it.
    fn set_result(&self, r: GenericResult) -> bool {
        self.result.send_if_modified(|cur| {
            if cur.is_some() {
                return false;
            }
            *cur = Some(r);
            true
        })
    }

    /// End the sandbox with `r` (unless it ended already) and its box, in the background.
    pub(crate) fn end(&self, r: GenericResult) -> bool {
        let first = self.set_result(r);
        let b = lock(&self.boxed).take();
        if let Some(b) = b {
            let id = self.id.clone();
            tokio::spawn(async move {
                if let Err(e) = b.destroy(&Ctx::background().with_timeout(BOX_TIMEOUT)).await {
                    tracing::warn!(sandbox = %id, error = %e, "ending a sandbox's box");
                }
            });
        }
        first
    }

    /// Wait until it ended or `limit` passed; the result if it ended.
    pub(crate) async fn wait(&self, limit: Duration) -> Option<GenericResult> {
        let mut rx = self.result.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|r| r.is_some())).await;
        self.result()
    }

    pub(crate) fn running_box(&self) -> Option<Arc<dyn Sandbox>> {
        if self.result.borrow().is_some() {
            return None;
        }
        lock(&self.boxed).clone()
    }
}

/// Watch the entrypoint (if any) and the lifetime: whichever comes first ends the sandbox.
pub(crate) fn supervise(sbx: Arc<Sbx>, entry: Option<agentbox_core::Process>) {
    tokio::spawn(async move {
        let lifetime = Duration::from_secs(u64::from(sbx.timeout_secs));
        let mut rx = sbx.result.subscribe();
        let ended = async move {
            let _ = rx.wait_for(|r| r.is_some()).await;
        };
        let mut entry = entry;
        // Its stdin is held open (a Modal sandbox's stdin is open while it runs), its output
        // read and dropped (the fake keeps no sandbox logs).
        let _stdin = entry.as_mut().and_then(|p| p.stdin.take());
        if let Some(p) = entry.as_mut() {
            for r in [p.stdout.take(), p.stderr.take()].into_iter().flatten() {
                tokio::spawn(discard(r));
            }
        }
        let exited = async {
            match entry.as_mut() {
                Some(p) => p.wait().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            st = exited => {
                let r = match st {
                    Some(st) if st.code == 0 => result(GenericStatus::Success, 0, ""),
                    Some(st) => result(GenericStatus::Failure, st.code, &format!("the entrypoint exited with code {}", st.code)),
                    None => result(GenericStatus::Failure, 137, "the entrypoint ended"),
                };
                sbx.end(r);
            }
            _ = tokio::time::sleep(lifetime) => {
                sbx.end(result(GenericStatus::Timeout, 124, &format!("Sandbox timed out after {} seconds", sbx.timeout_secs)));
            }
            _ = ended => {}
        }
    });
}

async fn discard(mut r: ByteReader) {
    let mut chunk = vec![0u8; 64 << 10];
    while let Ok(n) = r.read(&mut chunk).await {
        if n == 0 {
            break;
        }
    }
}

/// How an exec ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
}

/// One of an exec's output streams, kept whole (up to [`MAX_OUTPUT`]) so any offset can be
/// read again.
#[derive(Default)]
pub(crate) struct BufState {
    pub(crate) bytes: Vec<u8>,
    pub(crate) eof: bool,
    /// More was written than the fake keeps.
    pub(crate) over: bool,
}

pub(crate) struct Buf {
    pub(crate) state: Mutex<BufState>,
    pub(crate) bump: watch::Sender<u64>,
}

impl Buf {
    fn new() -> Arc<Buf> {
        Arc::new(Buf {
            state: Mutex::new(BufState::default()),
            bump: watch::channel(0).0,
        })
    }

    fn changed(&self) {
        self.bump.send_modify(|n| *n += 1);
    }

    /// Append; false past the bound (the stream is then over and at its end).
    fn push(&self, b: &[u8]) -> bool {
        let ok = {
            let mut s = lock(&self.state);
            if s.bytes.len() + b.len() > MAX_OUTPUT {
                s.over = true;
                s.eof = true;
                false
            } else {
                s.bytes.extend_from_slice(b);
                true
            }
        };
        self.changed();
        ok
    }

    pub(crate) fn close(&self) {
        lock(&self.state).eof = true;
        self.changed();
    }
}

/// The stdin side of an exec.
pub(crate) struct In {
    pub(crate) w: Option<Stdin>,
    pub(crate) written: u64,
    pub(crate) closed: bool,
}

/// One exec: its output as it comes, its stdin, its exit.
pub(crate) struct Exec {
    pub(crate) out: Arc<Buf>,
    pub(crate) err: Arc<Buf>,
    pub(crate) stdin: tokio::sync::Mutex<In>,
    pub(crate) exit: watch::Sender<Option<Exit>>,
}

/// Where an exec's stream goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Pipe,
    DevNull,
    /// stderr into stdout's stream.
    Stdout,
}

impl Exec {
    pub(crate) fn new() -> Arc<Exec> {
        Arc::new(Exec {
            out: Buf::new(),
            err: Buf::new(),
            stdin: tokio::sync::Mutex::new(In {
                w: None,
                written: 0,
                closed: false,
            }),
            exit: watch::channel(None).0,
        })
    }

    /// A program that could not start: `message` on stderr, exit 127 (a shell's "not found").
    pub(crate) fn failed(&self, message: &str) {
        self.err.push(message.as_bytes());
        self.out.close();
        self.err.close();
        self.exit.send_replace(Some(Exit::Code(127)));
    }

    pub(crate) fn exit(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Wire a started program: its streams pumped into the buffers, its stdin kept, its exit
    /// recorded; killed at `timeout` or when a stream passes the bound.
    pub(crate) async fn run(
        self: &Arc<Self>,
        mut p: agentbox_core::Process,
        out: Sink,
        err: Sink,
        timeout: Option<Duration>,
    ) {
        self.stdin.lock().await.w = p.stdin.take();
        let killer = p.killer();
        let mut pumps = tokio::task::JoinSet::new();
        let target = |s: Sink, own: &Arc<Buf>| match s {
            Sink::Pipe => Some(own.clone()),
            Sink::DevNull => None,
            Sink::Stdout => Some(self.out.clone()),
        };
        let merged = err == Sink::Stdout;
        let (over_tx, mut over_rx) = tokio::sync::mpsc::channel::<()>(2);
        if let Some(r) = p.stdout.take() {
            pumps.spawn(pump(r, target(out, &self.out), over_tx.clone()));
        }
        if let Some(r) = p.stderr.take() {
            pumps.spawn(pump(r, target(err, &self.err), over_tx));
        }
        let me = self.clone();
        tokio::spawn(async move {
            let deadline = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(deadline);
            let mut killed = false;
            let st = loop {
                tokio::select! {
                    st = p.wait() => break st,
                    _ = &mut deadline, if !killed => {
                        killed = true;
                        let _ = kill(&killer).await;
                    }
                    Some(()) = over_rx.recv(), if !killed => {
                        killed = true;
                        let _ = kill(&killer).await;
                    }
                }
            };
            let exit = match st {
                Ok(st) => match st.signal {
                    Some(sig) => Exit::Signal(sig),
                    None if st.code > 128 && killed => Exit::Signal(st.code - 128),
                    None => Exit::Code(st.code),
                },
                Err(_) => Exit::Signal(9),
            };
            me.exit.send_replace(Some(exit));
            let _ = tokio::time::timeout(OUTPUT_GRACE, async { while pumps.join_next().await.is_some() {} }).await;
            pumps.abort_all();
            me.out.close();
            me.err.close();
            if merged {
                // stderr's own stream holds nothing.
                me.err.close();
            }
        });
    }
}

async fn kill(k: &Killer) -> agentbox_core::Result<()> {
    k.signal(9).await
}

async fn pump(mut r: ByteReader, into: Option<Arc<Buf>>, over: tokio::sync::mpsc::Sender<()>) {
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(b) = &into
                    && !b.push(&chunk[..n])
                {
                    let _ = over.try_send(());
                    break;
                }
            }
        }
    }
    // A merged stderr leaves stdout open for stdout's own pump; the exec closes both at its end.
    if let Some(b) = &into
        && lock(&b.state).over
    {
        b.close();
    }
}
