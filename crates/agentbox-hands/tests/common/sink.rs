//! What the hands' tests share: a command's output collected as it arrives.

use std::sync::{Arc, Mutex};

use agentbox_hands::ExecOptions;

/// Exec options whose output callback collects all a command prints, and where it goes.
pub(crate) fn sink() -> (Arc<Mutex<String>>, ExecOptions) {
    let out = Arc::new(Mutex::new(String::new()));
    let o = out.clone();
    let opts = ExecOptions {
        on_output: Some(Arc::new(move |t: &str, _| {
            o.lock().unwrap().push_str(t);
            Ok(())
        })),
        ..Default::default()
    };
    (out, opts)
}
