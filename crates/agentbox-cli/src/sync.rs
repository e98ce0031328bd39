//! `agentbox sync …`: a box's files on this machine, trusting nothing the box sends.

use std::path::{Path, PathBuf};

use agentbox_core::{Ctx, Error, Result, SandboxId};
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum SyncCommand {
    /// Unpack a tar read on stdin into DEST, safely; print the receipt as JSON. Exits 0 when
    /// the archive was read to its end, 1 when it stopped.
    Extract {
        /// The directory to unpack into (made if missing).
        dest: std::path::PathBuf,
        /// Bytes of archive read at most.
        #[arg(long, default_value_t = agentbox_sync::MAX_BYTES)]
        max_bytes: u64,
        /// Members written or skipped at most.
        #[arg(long, default_value_t = agentbox_sync::MAX_ENTRIES)]
        max_entries: u64,
    },
    /// Send a directory of this machine into a box (links skipped); print what was sent.
    Seed {
        /// The box's id.
        id: SandboxId,
        /// The directory here.
        #[arg(long)]
        from: PathBuf,
        /// The directory in the box.
        #[arg(long)]
        to: String,
        /// Leave a relative path out (repeatable).
        #[arg(long)]
        exclude: Vec<String>,
        /// Send a relative path without a write bit (repeatable).
        #[arg(long)]
        read_only: Vec<String>,
    },
    /// Bring back what changed in a box directory since the last seed or pull of it. A file
    /// changed here since then is left as it is and named (`host_changed`, and on stderr).
    Pull {
        /// The box's id.
        id: SandboxId,
        /// The directory in the box.
        #[arg(long)]
        from: String,
        /// The directory here.
        #[arg(long)]
        to: PathBuf,
        /// Remove here what the box no longer has.
        #[arg(long)]
        mirror_deletes: bool,
        /// Leave a relative path out (repeatable).
        #[arg(long)]
        exclude: Vec<String>,
        /// Replace (or, with --mirror-deletes, remove) files here even when they changed here
        /// since the last seed or pull.
        #[arg(long)]
        force: bool,
    },
}

/// Where the mark of (box, box directory, host directory) is kept between calls.
fn mark_path(id: &SandboxId, boxdir: &str, host: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let host = std::fs::canonicalize(host).unwrap_or_else(|_| host.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (id.as_str(), boxdir, host.to_string_lossy().as_ref()).hash(&mut h);
    let dir = agentbox_providers::home::default_home()?.join("marks");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
    Ok(dir.join(format!("{}-{:016x}.json", id.name(), h.finish())))
}

fn print(v: &impl serde::Serialize) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).map_err(|e| Error::unknown(e.to_string()))?
    );
    Ok(())
}

pub(crate) async fn run(cmd: SyncCommand) -> Result<i32> {
    match cmd {
        SyncCommand::Extract {
            dest,
            max_bytes,
            max_entries,
        } => {
            let opts = agentbox_sync::Options {
                max_bytes,
                max_entries,
                ..Default::default()
            };
            let receipt = agentbox_sync::extract_tar(tokio::io::stdin(), dest, opts).await;
            let json = serde_json::to_string_pretty(&receipt).map_err(|e| Error::unknown(e.to_string()))?;
            println!("{json}");
            Ok(if receipt.stopped.is_some() { 1 } else { 0 })
        }
        SyncCommand::Seed {
            id,
            from,
            to,
            exclude,
            read_only,
        } => {
            let ctx = Ctx::background();
            let b = crate::boxes::attach(&id, &ctx).await?;
            let seeded = agentbox_sync::seed_dir(
                &*b,
                &agentbox_sync::SeedOptions {
                    from: from.clone(),
                    to: to.clone(),
                    exclude,
                    read_only,
                    ..Default::default()
                },
                &ctx,
            )
            .await?;
            seeded.mark.save(&mark_path(&id, &to, &from)?)?;
            print(&serde_json::json!({
                "sent": seeded.sent, "skipped": seeded.skipped,
                "copy_failed": seeded.copy_failed, "stopped": seeded.stopped,
            }))?;
            Ok(if seeded.stopped.is_some() { 1 } else { 0 })
        }
        SyncCommand::Pull {
            id,
            from,
            to,
            mirror_deletes,
            exclude,
            force,
        } => {
            let ctx = Ctx::background();
            let b = crate::boxes::attach(&id, &ctx).await?;
            let path = mark_path(&id, &from, &to)?;
            // A mark that is no mark is said, and the pull goes on without one: a file the host
            // holds as the box does is still taken as pulled, the others are named.
            let since = agentbox_sync::Mark::load(&path).unwrap_or_else(|e| {
                crate::term::say(&format!("sync pull: {e}; pulling as if none was kept"));
                None
            });
            let opts = agentbox_sync::PullOptions {
                from,
                to,
                since,
                mirror_deletes,
                exclude,
                if_unchanged: !force,
                ..Default::default()
            };
            let pulled = agentbox_sync::pull_dir(&*b, &opts, &ctx).await?;
            for p in &pulled.host_changed {
                crate::term::say(&format!(
                    "sync pull: left {p:?} as it is here: it changed here since the last seed or pull (--force takes the box's)"
                ));
            }
            pulled.mark.save(&path)?;
            print(&serde_json::json!({
                "fetched": pulled.fetched, "bytes": pulled.bytes, "deleted": pulled.deleted,
                "host_changed": pulled.host_changed, "copy_failed": pulled.copy_failed,
                "receipt": pulled.receipt,
            }))?;
            Ok(if pulled.receipt.stopped.is_some() { 1 } else { 0 })
        }
    }
}
