//! Files moved through `exec` alone, for boxes with no file API of their own: the bytes ride
//! a program's stdin or stdout, and the path rides argv, never the script's text.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, ExecOptions, FinishOptions, Result, Sandbox, finish};

const UPLOAD: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

/// Exit codes of [`DOWNLOAD`]: 3 missing, 4 a directory, 6 over the bound.
const DOWNLOAD: &str = r#"f=$1
[ -e "$f" ] || { echo "no such file" >&2; exit 3; }
[ -d "$f" ] && { echo "is a directory" >&2; exit 4; }
s=$(wc -c < "$f") || exit 5
[ "$s" -le "$2" ] || { echo "$s bytes" >&2; exit 6; }
exec cat -- "$f""#;

/// Write `data` to `path` in the box (relative to its workspace), making the parents.
pub async fn upload_by_exec(b: &dyn Sandbox, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
    check_path(path)?;
    let argv = ["sh", "-c", UPLOAD, "agentbox-upload", path].map(String::from);
    let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin: data.to_vec(),
            max_output: 64 * 1024,
        },
    )
    .await?;
    if out.status.code != 0 {
        return Err(Error::transfer_failed(format!(
            "writing {path} in the box: exit {}: {}",
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Ok(())
}

/// Read the file `path` of the box whole, refused `too_large` above `max_bytes` before a byte
/// of it moves.
pub async fn download_by_exec(b: &dyn Sandbox, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
    check_path(path)?;
    let argv = ["sh", "-c", DOWNLOAD, "agentbox-download", path, &max_bytes.to_string()].map(String::from);
    let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    let cap = usize::try_from(max_bytes).unwrap_or(usize::MAX).saturating_add(1);
    let out = finish(
        p,
        FinishOptions {
            stdin: Vec::new(),
            max_output: cap,
        },
    )
    .await
    .map_err(|e| {
        if e.code() == ErrorCode::TooLarge {
            Error::too_large(format!("{path}: grew over the {max_bytes}-byte bound"))
        } else {
            e
        }
    })?;
    let why = out.stderr_text().trim().to_string();
    match out.status.code {
        0 => Ok(out.stdout),
        3 => Err(Error::not_found(format!("{path}: no such file in the box"))),
        4 => Err(Error::invalid(format!("{path}: is a directory"))),
        6 => Err(Error::too_large(format!(
            "{path}: {why}, over the {max_bytes}-byte bound"
        ))),
        code => Err(Error::transfer_failed(format!(
            "reading {path} in the box: exit {code}: {why}"
        ))),
    }
}

fn check_path(path: &str) -> Result<()> {
    if path.is_empty() || path.contains('\0') {
        return Err(Error::invalid(format!("path {path:?}: must be non-empty with no NUL")));
    }
    Ok(())
}

/// How long one small control exec (a kill, a chown) may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
