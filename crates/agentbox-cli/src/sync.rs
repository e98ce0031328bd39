//! `agentbox sync …`: a box's files on this machine, trusting nothing the box sends.

use agentbox_core::{Error, Result};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum SyncCommand {
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
}

pub async fn run(cmd: SyncCommand) -> Result<i32> {
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
    }
}
