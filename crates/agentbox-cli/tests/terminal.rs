//! `agentbox box exec -it` and `box shell` as a person types them: in a terminal that tmux
//! draws, driven by `send-keys` and read back with `capture-pane`, on a local box with a
//! runner (the binary under test is its runner).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Whether tmux is here. Without it: a failure under CI (`scripts/test` installs it), else a
/// loud notice and the caller returns early.
fn tmux_available(test: &str) -> bool {
    if Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs tmux and there is none (scripts/test installs it)");
    }
    eprintln!("\n!!!! {test}: NO TMUX: this test did NOT run. Install tmux (scripts/test does). !!!!\n");
    false
}

/// One tmux server of its own (its own socket and an empty config) with one 100×30 window
/// whose shell is bash with the prompt `outer$ `.
struct Tmux {
    dir: tempfile::TempDir,
    socket: PathBuf,
}

const OUTER: &str = "outer$ ";

impl Tmux {
    fn new(home: &Path) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tmux.sock");
        let conf = dir.path().join("tmux.conf");
        // No status line: the pane is the window's full size. TERM `screen`, whose terminfo
        // every ncurses has (for tput in the box).
        std::fs::write(
            &conf,
            "set -g status off\nset -g history-limit 5000\nset -g default-terminal screen\n",
        )
        .unwrap();
        let t = Tmux { dir, socket };
        let bin = env!("CARGO_BIN_EXE_agentbox");
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&t.socket)
            .arg("-f")
            .arg(&conf)
            .args(["new-session", "-d", "-s", "t", "-x", "100", "-y", "30"])
            .args(["-e", &format!("AGENTBOX_HOME={}", home.display())])
            .args(["-e", &format!("AB={bin}")])
            .args(["-e", &format!("PS1={OUTER}")])
            .args(["-e", "AGENTBOX_PROVIDER=local"])
            // bash, not sh: dash as root prompts `# ` whatever PS1 says. Without readline,
            // which sets its own terminal modes at each prompt: the pane's terminal is the one
            // the shell was given.
            .args(["bash", "--norc", "--noprofile", "--noediting"])
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
        t.wait_for("the outer prompt", |s| s.contains(OUTER));
        t
    }

    fn tmux(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Type `line` and Enter.
    fn type_line(&self, line: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", line]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    /// The pane as it shows now (lines as drawn).
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
    }

    /// The pane with its history, wrapped lines joined.
    fn all(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", "t"]).stdout).into_owned()
    }

    /// Wait (20 s at most) until the pane with its history satisfies `ok`; the pane.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.all();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "waited 20 s for {what}; the pane:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of the line `KEY=value` the pane shows (the last one), once it does.
    fn value(&self, key: &str) -> String {
        let prefix = format!("{key}=");
        let s = self.wait_for(&prefix, |s| s.lines().any(|l| l.starts_with(&prefix)));
        s.lines()
            .rev()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap()
            .trim_end()
            .to_string()
    }

    /// A file the outer shell writes, once it has.
    fn file(&self, name: &str) -> String {
        let p = self.dir.path().join(name);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(&p)
                && s.ends_with('\n')
            {
                return s.trim_end().to_string();
            }
            assert!(
                Instant::now() < deadline,
                "the outer shell never wrote {name}:\n{}",
                self.all()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The pid of the one program the pane's shell runs in the foreground now.
    fn child_of_shell(&self) -> u32 {
        let out = self.tmux(&["display-message", "-p", "-t", "t", "#{pane_pid}"]);
        let shell: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        let kids: Vec<u32> = children.split_whitespace().map(|c| c.parse().unwrap()).collect();
        assert_eq!(kids.len(), 1, "the outer shell runs one program: {kids:?}");
        kids[0]
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// A local box, ended when the test ends.
struct Boxed {
    home: tempfile::TempDir,
    id: String,
}

impl Boxed {
    fn new() -> Boxed {
        let home = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args(["box", "create", "--provider", "local", "--lifetime", "5m"])
            .env("AGENTBOX_HOME", home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Boxed { home, id }
    }
}

impl Drop for Boxed {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args(["box", "rm", &self.id])
            .env("AGENTBOX_HOME", self.home.path())
            .output();
    }
}

/// `stty -a`'s words say a terminal in canonical mode with echo (not raw).
fn cooked(stty_a: &str) -> bool {
    let words: Vec<&str> = stty_a.split_whitespace().collect();
    words.contains(&"icanon") && words.contains(&"echo") && !words.contains(&"-icanon") && !words.contains(&"-echo")
}

#[test]
fn exec_it_gives_bash_a_terminal_of_its_own_and_gives_this_one_back() {
    if !tmux_available("exec_it_gives_bash_a_terminal_of_its_own_and_gives_this_one_back") {
        return;
    }
    let b = Boxed::new();
    let t = Tmux::new(b.home.path());
    let (before, outer_tty) = (t.path("before"), t.path("outer-tty"));
    t.type_line(&format!(
        "stty -g > {before}; tty > {outer_tty}; echo \"$TERM\" > {}",
        t.path("term")
    ));
    let (before, outer_tty, term) = (t.file("before"), t.file("outer-tty"), t.file("term"));
    assert!(cooked(&String::from_utf8_lossy(
        &Command::new("stty")
            .args(["-a", "-F", &outer_tty])
            .output()
            .unwrap()
            .stdout
    )));

    t.type_line(&format!(
        "\"$AB\" box exec -it {} --env 'PS1=in''ner$ ' -- bash --norc --noprofile; echo \"CODE=$?\"",
        b.id
    ));
    // The prompt is typed in two parts: what is typed is shown too, and must not match.
    t.wait_for("the inner prompt", |s| s.contains("inner$ "));

    // While it runs, this terminal is raw: keys go to the box as typed.
    let stty = Command::new("stty").args(["-a", "-F", &outer_tty]).output().unwrap();
    let words = String::from_utf8_lossy(&stty.stdout).into_owned();
    assert!(
        words.split_whitespace().any(|w| w == "-icanon") && words.split_whitespace().any(|w| w == "-echo"),
        "{words}"
    );

    // A terminal of its own, not this one, with this one's TERM and size.
    t.type_line("printf 'INNER=%s\\n' \"$(tty)\"");
    let inner = t.value("INNER");
    assert!(
        inner.starts_with("/dev/pts/") && inner != outer_tty,
        "{inner} vs {outer_tty}"
    );
    t.type_line("printf 'TERM_IN=%s\\n' \"$TERM\"");
    assert_eq!(t.value("TERM_IN"), term);
    t.type_line("printf 'SIZE=%s\\n' \"$(stty size)\"");
    assert_eq!(t.value("SIZE"), "30 100");

    // The window changes size: SIGWINCH here, a resize there.
    t.tmux(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    for k in 0.. {
        t.type_line(&format!("printf 'SIZE{k}=%s\\n' \"$(stty size)\""));
        if t.value(&format!("SIZE{k}")) == "40 120" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the box's terminal never took 40 120:\n{}",
            t.all()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Ctrl-C is the program's (a byte to the box's terminal), not this process's signal.
    // The key goes once `sleep` runs (a local box's programs are this machine's): typed
    // earlier, it would reach bash between its fork and the child's taking the terminal, and
    // under load that window is wide.
    t.type_line("sleep 31.25");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Command::new("pgrep")
        .args(["-f", "^sleep 31.25$"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            Instant::now() < deadline,
            "sleep 31.25 did not start in the box within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let prompts = t.all().matches("inner$ ").count();
    t.tmux(&["send-keys", "-t", "t", "C-c"]);
    // It ends `sleep`, and bash prompts again. The next line is typed only then, as a person
    // types it: keys that arrive with the Ctrl-C can be flushed with it (the terminal's
    // `isig` drops its input queue), and keys typed before the prompt race bash's reading.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Command::new("pgrep")
        .args(["-f", "^sleep 31.25$"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            Instant::now() < deadline,
            "Ctrl-C did not end sleep 31.25 within 20 s:\n{}",
            t.all()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.wait_for("the inner prompt after Ctrl-C", |s| {
        s.matches("inner$ ").count() > prompts
    });
    // bash's own variable: the outer sh (had agentbox ended) prints no "yes".
    t.type_line("printf 'ALIVE=%s\\n' \"${BASH_VERSION:+yes}\"");
    assert_eq!(t.value("ALIVE"), "yes");

    // Escape sequences reach this terminal as they were written: a cursor moved as curses does.
    t.type_line("printf '\\033[2J\\033[5;10HCURS%s\\033[12;1H' ES");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = t.screen();
        if screen.lines().nth(4).and_then(|l| l.find("CURSES")) == Some(9) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "CURSES never drawn at row 5, column 10:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t.type_line("tput cup 14 20; printf 'TP%s' UT; tput cup 16 0");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = t.screen();
        if screen.lines().nth(14).and_then(|l| l.find("TPUT")) == Some(20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tput's TPUT never drawn at row 15, column 21:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Its exit code is this command's, and this terminal is as it was.
    t.type_line("exit 3");
    assert_eq!(t.value("CODE"), "3");
    let after = t.path("after");
    t.type_line(&format!("stty -g > {after}"));
    assert_eq!(t.file("after"), before, "the terminal's settings are put back");
}

#[test]
fn signals_attach_and_box_shell_give_the_terminal_back() {
    if !tmux_available("signals_attach_and_box_shell_give_the_terminal_back") {
        return;
    }
    let b = Boxed::new();
    let t = Tmux::new(b.home.path());
    let (before, outer_tty) = (t.path("before"), t.path("outer-tty"));
    t.type_line(&format!("stty -g > {before}; tty > {outer_tty}"));
    let (before, outer_tty) = (t.file("before"), t.file("outer-tty"));

    for (sig, code) in [("TERM", 143), ("HUP", 129)] {
        t.type_line(&format!(
            "\"$AB\" box exec -it {} -- sh -c 'echo READY{sig}; sleep 60'; echo \"CODE{sig}=$?\"",
            b.id
        ));
        t.wait_for("the program", |s| {
            s.lines().any(|l| l.starts_with(&format!("READY{sig}")))
        });
        let stty = Command::new("stty").args(["-a", "-F", &outer_tty]).output().unwrap();
        assert!(!cooked(&String::from_utf8_lossy(&stty.stdout)), "raw while it runs");
        let pid = t.child_of_shell();
        assert!(
            Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        assert_eq!(t.value(&format!("CODE{sig}")), code.to_string());
        let after = t.path(&format!("after-{sig}"));
        t.type_line(&format!("stty -g > {after}"));
        assert_eq!(
            t.file(&format!("after-{sig}")),
            before,
            "SIG{sig}: the terminal's settings are put back"
        );
    }
    // The program was killed with it: nothing of it is left in the box.
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["box", "ps", &b.id, "--json"])
        .env("AGENTBOX_HOME", b.home.path())
        .output()
        .unwrap();
    let ps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(ps.as_array().unwrap().iter().all(|p| p["state"] != "running"), "{ps}");

    // A detached program with a terminal, attached to and let go of with Ctrl-P Ctrl-Q.
    t.type_line(&format!(
        "\"$AB\" box exec -d -t {} --env 'PS1=ke''pt$ ' -- bash --norc --noprofile > {}",
        b.id,
        t.path("handle")
    ));
    let handle = t.file("handle");
    t.type_line(&format!(
        "\"$AB\" box attach {} {handle}; echo \"ATTACH_CODE=$?\"",
        b.id
    ));
    t.wait_for("the kept prompt", |s| s.contains("kept$ "));
    t.type_line("printf 'KEPT=%s\\n' \"${BASH_VERSION:+yes}\"");
    assert_eq!(t.value("KEPT"), "yes");
    t.tmux(&["send-keys", "-t", "t", "C-p", "C-q"]);
    assert_eq!(t.value("ATTACH_CODE"), "0");
    assert!(
        t.all().contains(&format!("let go of process {handle}; it runs on")),
        "{}",
        t.all()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["box", "ps", &b.id, "--json"])
        .env("AGENTBOX_HOME", b.home.path())
        .output()
        .unwrap();
    let ps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["handle"].as_u64() == handle.parse().ok())
        .unwrap_or_else(|| panic!("{handle} in {ps}"));
    assert_eq!(
        (kept["state"].as_str(), kept["tty"].as_bool()),
        (Some("running"), Some(true)),
        "{kept}"
    );
    let after = t.path("after-attach");
    t.type_line(&format!("stty -g > {after}"));
    assert_eq!(t.file("after-attach"), before, "the terminal's settings are put back");
    // Attached again, it is the same shell; its exit is the attach's exit code.
    t.type_line(&format!(
        "\"$AB\" box attach {} {handle}; echo \"ATTACH2_CODE=$?\"",
        b.id
    ));
    std::thread::sleep(Duration::from_millis(500));
    t.type_line("exit 6");
    assert_eq!(t.value("ATTACH2_CODE"), "6");

    // box shell: bash (the box has it), in a terminal.
    t.type_line(&format!("\"$AB\" box shell {}; echo \"SHELL_CODE=$?\"", b.id));
    std::thread::sleep(Duration::from_millis(500));
    t.type_line("printf 'SH=%s\\n' \"${BASH_VERSION:+bash}\"");
    let shell = t.value("SH");
    assert_eq!(shell, "bash", "{}", t.all());
    t.type_line("exit");
    assert_eq!(t.value("SHELL_CODE"), "0");
    let after = t.path("after-shell");
    t.type_line(&format!("stty -g > {after}"));
    assert_eq!(t.file("after-shell"), before);
}
