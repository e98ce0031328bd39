//! The toolbox's sessions: one shell per session, in the sandbox's box, whose commands run in
//! turn (so `cd` and exported variables persist), as the daemon's `pkg/session` does.
//!
//! The shell is bash where the box's root has it (else sh), started with its stdin, stdout
//! and stderr as pipes to the fake. A command is written to its stdin as
//! `{\n<command>\n} ; rc=$? ; printf MARK:rc ; printf MARK >&2`, MARK holding a random token
//! of that command's, and the fake reads both pipes: bytes before a stream's MARK are the
//! command's, the rc after stdout's MARK its exit code, and the command is done once both
//! MARKs came. A command's stdin is the shell's (bash reads a pipe one byte at a time, so a
//! command reading stdin gets the input sent to it, and the shell the next command), which is
//! how the daemon feeds `input` too.
//!
//! Where it differs from the daemon, which sends each command's output to files of its own:
//! output a command's background program writes after the command ended is logged to the
//! newest command of the session (the daemon logs it to the command that started it), and
//! one stream's order against the other's is as the two pipes deliver it.
//!
//! The log is kept as the daemon keeps it: each line of stdout as `\x01\x01\x01LINE\n`, each
//! of stderr as `\x02\x02\x02LINE\n` (a final newline added, NUL bytes dropped, as its
//! `read -r` + `printf` does), bounded at [`LOG_BOUND`] bytes per command (past it the rest
//! is not kept).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, Killer, Sandbox, Stdin};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::daytona::error::DError;

/// The bytes of one command's log kept.
pub(crate) const LOG_BOUND: usize = 16 << 20;
/// The daemon's line markers.
pub(crate) const STDOUT_MARK: &[u8] = b"\x01\x01\x01";
pub(crate) const STDERR_MARK: &[u8] = b"\x02\x02\x02";
/// How many sessions one sandbox may hold.
const MAX_SESSIONS: usize = 256;
/// How many commands one session keeps (the oldest finished ones let go).
const MAX_COMMANDS: usize = 1024;

/// A sandbox's sessions.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<BTreeMap<String, Arc<Session>>>,
}

impl Sessions {
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub(crate) fn list(&self) -> Vec<Arc<Session>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Start the session's shell in `b`: 409 when the id is taken.
    pub(crate) async fn create(&self, id: &str, b: Arc<dyn Sandbox>, shell: &str) -> Result<(), DError> {
        {
            let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if m.contains_key(id) {
                return Err(DError::daemon(409, "CONFLICT", format!("session {id} already exists")));
            }
            if m.len() >= MAX_SESSIONS {
                return Err(DError::daemon_bad_request(format!(
                    "this sandbox holds {MAX_SESSIONS} sessions already: delete one first"
                )));
            }
        }
        let s = Session::start(id, b, shell).await?;
        let taken = {
            let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            let taken = m.contains_key(id);
            if !taken {
                m.insert(id.to_string(), s.clone());
            }
            taken
        };
        if taken {
            s.end().await;
            return Err(DError::daemon(409, "CONFLICT", format!("session {id} already exists")));
        }
        Ok(())
    }

    /// End the session and forget it; `false` when there was none.
    pub(crate) async fn delete(&self, id: &str) -> bool {
        let s = self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        match s {
            Some(s) => {
                s.end().await;
                true
            }
            None => false,
        }
    }

    pub(crate) async fn end_all(&self) {
        let all: Vec<Arc<Session>> = std::mem::take(&mut *self.map.lock().unwrap_or_else(|p| p.into_inner()))
            .into_values()
            .collect();
        for s in all {
            s.end().await;
        }
    }
}

/// Which command the shell runs now, and the newest one (where stray output goes).
#[derive(Default)]
struct Route {
    current: Option<Arc<Cmd>>,
    last: Option<Arc<Cmd>>,
}

/// One session: its shell and its commands.
pub(crate) struct Session {
    pub(crate) id: String,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    killer: Killer,
    cmds: Mutex<Vec<Arc<Cmd>>>,
    queue: mpsc::UnboundedSender<Arc<Cmd>>,
    route: Arc<Mutex<Route>>,
    /// Set once the shell has exited (or was ended).
    pub(crate) ended: watch::Sender<bool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// One command of a session.
pub(crate) struct Cmd {
    pub(crate) id: String,
    pub(crate) command: String,
    suppress_echo: bool,
    token: Vec<u8>,
    st: Mutex<CmdState>,
    /// Bumped on every change of the log or the exit.
    pub(crate) changed: watch::Sender<u64>,
}

#[derive(Default)]
struct CmdState {
    started: bool,
    output: Vec<u8>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    partial: [Vec<u8>; 2],
    done: [bool; 2],
    rc: Option<i32>,
    exit: Option<i32>,
}

/// A command's log as the logs endpoint answers it.
pub(crate) struct Logs {
    pub(crate) output: Vec<u8>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

impl Cmd {
    fn notify(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn exit_code(&self) -> Option<i32> {
        self.st.lock().unwrap_or_else(|p| p.into_inner()).exit
    }

    pub(crate) fn logs(&self) -> Logs {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        Logs {
            output: st.output.clone(),
            stdout: st.stdout.clone(),
            stderr: st.stderr.clone(),
        }
    }

    /// The log from byte `from` on, and whether the command has ended.
    pub(crate) fn output_from(&self, from: usize) -> (Vec<u8>, bool) {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        (st.output.get(from..).unwrap_or_default().to_vec(), st.exit.is_some())
    }

    pub(crate) fn json(&self) -> Value {
        let mut v = json!({"id": self.id, "command": self.command});
        if let Some(c) = self.exit_code() {
            v["exitCode"] = json!(c);
        }
        v
    }

    /// Bytes of stream `k` (0 stdout, 1 stderr), split into the daemon's lines.
    fn push(&self, k: usize, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        {
            let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
            for &b in bytes {
                match b {
                    0 => {}
                    b'\n' => {
                        let line = std::mem::take(&mut st.partial[k]);
                        emit(&mut st, k, &line);
                    }
                    _ => st.partial[k].push(b),
                }
            }
            if st.partial[k].len() > LOG_BOUND {
                let line = std::mem::take(&mut st.partial[k]);
                emit(&mut st, k, &line);
            }
        }
        self.notify();
    }

    /// Stream `k`'s marker came (`rc` on stdout's); the command's exit once both did.
    fn stream_done(&self, k: usize, rc: Option<i32>) -> bool {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.done[k] = true;
        if rc.is_some() {
            st.rc = rc;
        }
        let finished = st.done[0] && st.done[1];
        if finished {
            let rc = st.rc.unwrap_or(-1);
            finish(&mut st, rc);
        }
        drop(st);
        self.notify();
        finished
    }

    /// The shell ended under the command: it ends with the shell's code.
    fn abandon(&self, code: i32) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if st.exit.is_none() && st.started {
            finish(&mut st, code);
        }
        drop(st);
        self.notify();
    }
}

fn emit(st: &mut CmdState, k: usize, line: &[u8]) {
    if st.output.len() + line.len() + 4 > LOG_BOUND {
        return;
    }
    st.output
        .extend_from_slice(if k == 0 { STDOUT_MARK } else { STDERR_MARK });
    st.output.extend_from_slice(line);
    st.output.push(b'\n');
    let to = if k == 0 { &mut st.stdout } else { &mut st.stderr };
    to.extend_from_slice(line);
    to.push(b'\n');
}

fn finish(st: &mut CmdState, code: i32) {
    for k in 0..2 {
        if !st.partial[k].is_empty() {
            let line = std::mem::take(&mut st.partial[k]);
            emit(st, k, &line);
        }
    }
    st.exit = Some(code);
}

impl Session {
    async fn start(id: &str, b: Arc<dyn Sandbox>, shell: &str) -> Result<Arc<Session>, DError> {
        // The context governs only the start's wait: the shell lives until the session ends.
        let mut p = b
            .exec(&[shell.to_string()], &ExecOptions::default(), &Ctx::background())
            .await
            .map_err(|e| {
                DError::internal(
                    format!("starting the session's shell: {}", e.message()),
                    crate::daytona::error::Source::Daemon,
                )
            })?;
        let killer = p.killer();
        let stdin = p.stdin.take();
        let (out, err) = (p.stdout.take(), p.stderr.take());
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Arc::new(Session {
            id: id.to_string(),
            stdin: tokio::sync::Mutex::new(stdin),
            killer,
            cmds: Mutex::new(Vec::new()),
            queue: tx,
            route: Arc::new(Mutex::new(Route::default())),
            ended: watch::Sender::new(false),
            tasks: Mutex::new(Vec::new()),
        });
        let mut tasks = Vec::new();
        let mut readers = Vec::new();
        for (k, r) in [(0usize, out), (1, err)] {
            if let Some(r) = r {
                let route = s.route.clone();
                readers.push(tokio::spawn(read_stream(k, r, route)));
            }
        }
        {
            let s2 = s.clone();
            tasks.push(tokio::spawn(async move {
                let code = match p.wait().await {
                    Ok(st) => st.code,
                    Err(_) => 137,
                };
                for r in readers {
                    let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
                }
                let cur = s2.route.lock().unwrap_or_else(|p| p.into_inner()).current.take();
                if let Some(c) = cur {
                    c.abandon(code);
                }
                let _ = s2.ended.send(true);
            }));
        }
        {
            let s2 = s.clone();
            tasks.push(tokio::spawn(async move { s2.run(rx).await }));
        }
        *s.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(s)
    }

    pub(crate) fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Kill the shell and everything of its process group (its running command).
    pub(crate) async fn end(&self) {
        let _ = self.killer.signal(9).await;
        if let Some(mut w) = self.stdin.lock().await.take() {
            let _ = w.close().await;
        }
        let mut rx = self.ended.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|e| *e)).await;
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        let _ = self.ended.send(true);
    }

    pub(crate) fn commands(&self) -> Vec<Arc<Cmd>> {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn command(&self, id: &str) -> Option<Arc<Cmd>> {
        self.cmds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|c| c.id == id)
            .cloned()
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "sessionId": self.id,
            "commands": self.commands().iter().map(|c| c.json()).collect::<Vec<_>>(),
        })
    }

    /// Queue `command`; it runs once the commands before it ended.
    pub(crate) fn exec(&self, command: &str, suppress_echo: bool) -> Result<Arc<Cmd>, DError> {
        if self.is_ended() {
            return Err(DError::daemon(
                410,
                "SESSION_ENDED",
                format!("session {} has ended", self.id),
            ));
        }
        let mut raw = [0u8; 8];
        let _ = getrandom::fill(&mut raw);
        let hex: String = raw.iter().map(|x| format!("{x:02x}")).collect();
        let mut token = b"\x1f\x1fDTN".to_vec();
        token.extend_from_slice(hex.as_bytes());
        token.push(0x1f);
        let cmd = Arc::new(Cmd {
            id: crate::daytona::state::uuid(),
            command: command.to_string(),
            suppress_echo,
            token,
            st: Mutex::new(CmdState::default()),
            changed: watch::Sender::new(0),
        });
        {
            let mut cmds = self.cmds.lock().unwrap_or_else(|p| p.into_inner());
            if cmds.len() >= MAX_COMMANDS
                && let Some(i) = cmds.iter().position(|c| c.exit_code().is_some())
            {
                cmds.remove(i);
            }
            cmds.push(cmd.clone());
        }
        self.queue
            .send(cmd.clone())
            .map_err(|_| DError::daemon(410, "SESSION_ENDED", format!("session {} has ended", self.id)))?;
        Ok(cmd)
    }

    /// Send `data` and a newline to the running command's stdin (echoed to its log unless
    /// the exec said `suppressInputEcho`).
    pub(crate) async fn input(&self, cmd: &Arc<Cmd>, data: &str) -> Result<(), DError> {
        if cmd.exit_code().is_some() {
            return Err(DError::daemon(
                410,
                "COMMAND_ALREADY_COMPLETED",
                format!("command {} has already completed", cmd.id),
            ));
        }
        let running = {
            let r = self.route.lock().unwrap_or_else(|p| p.into_inner());
            r.current.as_ref().is_some_and(|c| Arc::ptr_eq(c, cmd))
        };
        if !running {
            return Err(DError::daemon_bad_request(format!(
                "command {} has not started: the commands before it in session {} still run",
                cmd.id, self.id
            )));
        }
        let mut line = data.as_bytes().to_vec();
        line.push(b'\n');
        let mut w = self.stdin.lock().await;
        let Some(w) = w.as_mut() else {
            return Err(DError::daemon(
                410,
                "SESSION_ENDED",
                format!("session {} has ended", self.id),
            ));
        };
        w.write_all(&line).await.map_err(|e| {
            DError::internal(
                format!("writing the command's input: {e}"),
                crate::daytona::error::Source::Daemon,
            )
        })?;
        let _ = w.flush().await;
        if !cmd.suppress_echo {
            cmd.push(0, &line);
        }
        Ok(())
    }

    /// Wait until `cmd` ends (or the session does); its exit code.
    pub(crate) async fn wait(&self, cmd: &Arc<Cmd>) -> Option<i32> {
        let mut changed = cmd.changed.subscribe();
        let mut ended = self.ended.subscribe();
        loop {
            if let Some(c) = cmd.exit_code() {
                return Some(c);
            }
            if *ended.borrow_and_update() {
                return cmd.exit_code();
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return cmd.exit_code() },
                r = ended.changed() => if r.is_err() { return cmd.exit_code() },
            }
        }
    }

    /// Run the queued commands one after the other.
    async fn run(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Arc<Cmd>>) {
        while let Some(cmd) = rx.recv().await {
            if self.is_ended() {
                break;
            }
            let hex = String::from_utf8_lossy(&cmd.token[5..cmd.token.len() - 1]).into_owned();
            let script = format!(
                "{{\n{}\n}} ; __daytona_rc=$? ; printf '\\037\\037DTN%s\\037:%d\\n' {hex} \"$__daytona_rc\" ; printf '\\037\\037DTN%s\\037\\n' {hex} >&2\n",
                cmd.command
            );
            let wrote = {
                // The shell's stdin is held from before the command is made current until its
                // script is written: an input for it (which waits for the same lock) then
                // follows its script, never comes before it (where the shell would read the
                // input as a command, and the command wait for input that went by).
                let mut w = self.stdin.lock().await;
                {
                    let mut r = self.route.lock().unwrap_or_else(|p| p.into_inner());
                    r.current = Some(cmd.clone());
                    r.last = Some(cmd.clone());
                    cmd.st.lock().unwrap_or_else(|p| p.into_inner()).started = true;
                }
                match w.as_mut() {
                    Some(w) => w.write_all(script.as_bytes()).await.is_ok() && w.flush().await.is_ok(),
                    None => false,
                }
            };
            if !wrote {
                cmd.abandon(-1);
                break;
            }
            self.wait(&cmd).await;
        }
    }
}

/// Read one of the shell's streams, handing its bytes to the command that wrote them.
async fn read_stream(k: usize, mut r: agentbox_core::ByteReader, route: Arc<Mutex<Route>>) {
    let mut held: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held.extend_from_slice(&buf[..n]);
        route_bytes(k, &mut held, &route);
    }
    // What is left (a partial marker the shell never finished) is the newest command's.
    let last = route.lock().unwrap_or_else(|p| p.into_inner()).last.clone();
    if let Some(c) = last {
        c.push(k, &held);
    }
}

fn route_bytes(k: usize, held: &mut Vec<u8>, route: &Mutex<Route>) {
    loop {
        let (cur, last) = {
            let r = route.lock().unwrap_or_else(|p| p.into_inner());
            (r.current.clone(), r.last.clone())
        };
        let waiting = cur.filter(|c| !c.st.lock().unwrap_or_else(|p| p.into_inner()).done[k]);
        let Some(cmd) = waiting else {
            if let Some(c) = last {
                c.push(k, held);
            }
            held.clear();
            return;
        };
        match find(held, &cmd.token) {
            Some(pos) => {
                let after = pos + cmd.token.len();
                let Some(nl) = held[after..].iter().position(|b| *b == b'\n') else {
                    // The marker's end has not come yet.
                    cmd.push(k, &held[..pos]);
                    held.drain(..pos);
                    return;
                };
                let tail = &held[after..after + nl];
                let rc = if k == 0 {
                    std::str::from_utf8(tail)
                        .ok()
                        .and_then(|t| t.strip_prefix(':'))
                        .and_then(|t| t.trim().parse::<i32>().ok())
                } else {
                    None
                };
                cmd.push(k, &held[..pos]);
                held.drain(..after + nl + 1);
                if cmd.stream_done(k, rc) {
                    let mut r = route.lock().unwrap_or_else(|p| p.into_inner());
                    if r.current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &cmd)) {
                        r.current = None;
                    }
                }
            }
            None => {
                let keep = partial_suffix(held, &cmd.token);
                let upto = held.len() - keep;
                cmd.push(k, &held[..upto]);
                held.drain(..upto);
                return;
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `hay` that begins `needle` (held back: the marker may be
/// cut across two reads).
fn partial_suffix(hay: &[u8], needle: &[u8]) -> usize {
    let max = needle.len().saturating_sub(1).min(hay.len());
    (1..=max)
        .rev()
        .find(|&n| hay[hay.len() - n..] == needle[..n])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_cut_across_reads_is_held_back() {
        assert_eq!(partial_suffix(b"abc\x1f\x1fD", b"\x1f\x1fDTN"), 3);
        assert_eq!(partial_suffix(b"abc", b"\x1f\x1fDTN"), 0);
        assert_eq!(find(b"ab\x1f\x1fDTNx", b"\x1f\x1fDTN"), Some(2));
    }

    #[test]
    fn lines_are_labelled_and_nuls_dropped() {
        let c = Cmd {
            id: "c".into(),
            command: "x".into(),
            suppress_echo: false,
            token: b"\x1f\x1fDTNaa\x1f".to_vec(),
            st: Mutex::new(CmdState::default()),
            changed: watch::Sender::new(0),
        };
        c.push(0, b"one\ntw\0o");
        c.push(1, b"err\n");
        c.stream_done(0, Some(3));
        c.stream_done(1, None);
        let l = c.logs();
        assert_eq!(l.output, b"\x01\x01\x01one\n\x02\x02\x02err\n\x01\x01\x01two\n");
        assert_eq!(l.stdout, b"one\ntwo\n");
        assert_eq!(l.stderr, b"err\n");
        assert_eq!(c.exit_code(), Some(3));
    }
}
