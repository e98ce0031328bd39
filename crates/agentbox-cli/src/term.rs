//! This process's terminal while a program in a box has one of its own: raw mode, so every
//! key goes to the program as typed, and the terminal put back as it was on every way out
//! (the program's end, an error, a panic, SIGTERM or SIGHUP), as `docker exec -it` does.

use std::sync::{Mutex, Once};

use agentbox_core::{Error, MAX_TTY, Result, Tty};
use rustix::termios::{self, OptionalActions, Termios};

/// The terminal's settings before raw mode, while it is in raw mode: what every way out puts
/// back. A static, so the panic hook and the signal handlers reach it without the guard.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Whether stdin is a terminal.
pub(crate) fn stdin_is_terminal() -> bool {
    termios::isatty(rustix::stdio::stdin())
}

/// The size of this process's terminal (stdin's, else stdout's), as rows and columns a box
/// takes; `None` when neither is a terminal or it says 0 (a terminal that never set one).
pub(crate) fn size() -> Option<(u16, u16)> {
    let ws = termios::tcgetwinsize(rustix::stdio::stdin())
        .or_else(|_| termios::tcgetwinsize(rustix::stdio::stdout()))
        .ok()?;
    if ws.ws_row == 0 || ws.ws_col == 0 {
        return None;
    }
    Some((ws.ws_row.min(MAX_TTY), ws.ws_col.min(MAX_TTY)))
}

/// The terminal a program in a box gets: this one's size (24×80 where there is none) and
/// `$TERM` (left to the box's default when unset or not a terminal name).
pub(crate) fn tty_here() -> Tty {
    let (rows, cols) = size().unwrap_or((24, 80));
    let term = std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_graphic()));
    Tty { rows, cols, term }
}

/// stdin in raw mode while this lives; dropping it puts the terminal back.
pub(crate) struct Raw(());

impl Raw {
    /// Put stdin's terminal in raw mode (no echo, no line editing, no signals from keys:
    /// Ctrl-C is a byte for the program), after saving how it was for [`restore`].
    pub(crate) fn enter() -> Result<Raw> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            // A panic anywhere must not leave the person's terminal raw (with panic = abort
            // too: the hook runs before the abort).
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        let fd = rustix::stdio::stdin();
        let saved = termios::tcgetattr(fd).map_err(|e| Error::io(e.into(), "reading the terminal's settings"))?;
        let mut raw = saved.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(saved);
        if let Err(e) = termios::tcsetattr(fd, OptionalActions::Now, &raw) {
            restore();
            return Err(Error::io(e.into(), "putting the terminal in raw mode"));
        }
        Ok(Raw(()))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        restore();
    }
}

/// Put the terminal back as [`Raw::enter`] found it, once; a no-op when it is not raw.
pub(crate) fn restore() {
    let saved = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(t) = saved {
        // Drain: what the program wrote last is shown before the settings change.
        let _ = termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Drain, &t);
    }
}

/// Whether the terminal is raw now (a line said on stderr then needs its own carriage return).
pub(crate) fn is_raw() -> bool {
    SAVED.lock().unwrap_or_else(|p| p.into_inner()).is_some()
}

/// Say `line` on stderr, as a line even while the terminal is raw.
pub(crate) fn say(line: &str) {
    let end = if is_raw() { "\r\n" } else { "\n" };
    eprint!("agentbox: {line}{end}");
}
