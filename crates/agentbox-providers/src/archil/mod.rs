//! Archil exec boxes: a box is the directory `boxes/<id>/` of an agent's Archil work disk, and
//! each command is one serverless exec call (a fresh VM container with that directory
//! mounted, one request that answers when the command has ended). Files move through the
//! disk's S3-style object API, every byte value exact.
//!
//! What Archil's exec gives, and so what the provider promises:
//! - **No live processes** (`facts.live_processes` is false): no program runs between calls, a
//!   command's output arrives once it ended, and it takes no input (a write to its stdin fails
//!   `unsupported`). Output is text: bytes that are not UTF-8 come back as U+FFFD; move bytes
//!   with upload and download.
//! - **A 300 s limit per call** (`facts.max_exec_ms`): an exec timeout above it is refused
//!   `invalid`, and every command runs under `timeout` in the container, its own deadline at
//!   most 295 s (and no later than the caller's context or the box's lifetime), so nothing runs
//!   past the point where the platform cuts a call. A command ended by its deadline, or that
//!   exits 124 (what `timeout` exits with), is a `timeout` error.
//! - **No kill:** nothing reaches a running call. A caller that gives up is answered at once,
//!   its command ends at its own deadline, and the box's next call waits for it.
//! - **One command at a time per box, across processes:** each exec checks out the box's
//!   directory in Archil's queue (`queueMs`, [`ArchilOptions::queue`]), and a provider sends a
//!   box's calls in the order they were asked. An upload takes no checkout: it waits for this
//!   process's commands and tries again while another process holds the directory.
//! - **No env:** the exec call carries only the command, so a spec with env is refused
//!   `unsupported`, and so is an exec's env.
//! - **Lifetime checked, never enforced by a timer:** the box's record
//!   (`boxes.records/<id>.json`, outside every directory a command can hold) keeps its labels,
//!   facts and end. Every call that looks at a box (attach, list, exec, status, upload,
//!   download) reads it: a box past its end is ended there, its record deleted and its
//!   directory removed. A box nobody calls again stays on the disk until a list finds it.
//! - **Destroy** deletes the record (the box ends for every client at once), then removes the
//!   directory through its parent, waiting [`ArchilOptions::destroy_wait`] for a command that
//!   holds it; one it could not remove is swept by the next list, which removes every box
//!   directory with no record.
//! - **Refused before any call:** a GPU, a snapshot, a workspace, an isolation other than `vm`,
//!   more than 2 vCPU or 3938 MiB (`unsupported`: the exec container's size), network rules,
//!   ports, mounts, env; a label in the providers' namespace and a lifetime that is not
//!   positive (`invalid`).
//! - **Shared disk:** each call is its own VM, but boxes on one disk share it; a command can
//!   reach every box's directory and the records on that disk. Give each agent its own disk.
//!
//! The key is read from [`ArchilOptions::api_key`] or `ARCHIL_API_KEY`, stays on this host, and
//! is never logged, put in an error, or given to a box (the record and every command carry
//! none).
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::archil::{ArchilOptions, ArchilProvider};
//! // ARCHIL_API_KEY, ARCHIL_REGION (or ARCHIL_BASE_URL and ARCHIL_S3_BASE_URL), ARCHIL_DISK.
//! let provider = ArchilProvider::new(ArchilOptions::from_env()?)?;
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &Ctx::background()).await?;
//! b.upload("notes.txt", b"hello", &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod api;
mod options;
mod record;
mod sandbox;

pub use options::{ArchilOptions, REGIONS, region_url, s3_url_of};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Honours, Labels, Provider, Result, Sandbox, SandboxId, Spec, check_spec};
use async_trait::async_trait;
use tracing::Instrument;

pub use crate::vendor::ApiKey;
pub use sandbox::ArchilSandbox;

use api::Api;
use record::Record;
use sandbox::Shared;

/// The provider's name and id prefix.
pub const NAME: &str = "archil";

/// The variables [`ArchilOptions::from_env`] reads.
pub const VARIABLES: [&str; 5] = [
    "ARCHIL_API_KEY",
    "ARCHIL_REGION",
    "ARCHIL_BASE_URL",
    "ARCHIL_S3_BASE_URL",
    "ARCHIL_DISK",
];

/// The longest one exec call may run: Archil cuts a call here.
pub const EXEC_LIMIT: Duration = Duration::from_secs(300);
/// The deadline a command gets in its container at most, short of [`EXEC_LIMIT`] so it ends
/// (and its writes land) before the platform cuts the call.
pub const OWN_DEADLINE: Duration = Duration::from_secs(295);
/// The exec container's CPUs.
pub const MAX_CPUS: f64 = 2.0;
/// The exec container's memory in MiB.
pub const MAX_MEMORY_MB: u64 = 3938;
/// Where a box's directory is mounted in its container: its workspace.
pub const WORKSPACE: &str = "/mnt/archil/box";

/// The directory of the disk that holds the boxes, one directory each.
const BOXES: &str = "boxes";
/// The directory of the disk that holds the boxes' records, outside every box.
const RECORDS: &str = "boxes.records";

/// Whether `name` is what this provider names a box: 16 lowercase hex digits. Nothing else on
/// the disk is ever taken for a box, swept, or put in a command.
pub(crate) fn is_box_name(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Archil exec boxes. See the [module documentation](self).
pub struct ArchilProvider {
    shared: Arc<Shared>,
    /// The disk's id once found (a disk named by name is looked up once).
    disk: tokio::sync::OnceCell<String>,
    disk_named: String,
}

impl ArchilProvider {
    /// A provider over `opts`; refuses options with no key or no disk, naming the variable.
    pub fn new(opts: ArchilOptions) -> Result<Self> {
        let key = opts
            .api_key
            .clone()
            .ok_or_else(|| Error::invalid("ARCHIL_API_KEY: no Archil API key was given"))?;
        let disk = opts
            .disk
            .clone()
            .ok_or_else(|| Error::invalid("ARCHIL_DISK: name the agent's work disk (its id, dsk-…, or its name)"))?;
        if disk.is_empty() || disk.contains('/') || disk.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "ARCHIL_DISK: {disk:?} is not a disk id or name"
            )));
        }
        if opts.exec_limit.is_zero() || opts.own_deadline.is_zero() || opts.own_deadline > opts.exec_limit {
            return Err(Error::invalid(format!(
                "archil options: the command's own deadline ({:?}) must be over 0 and within the exec limit ({:?})",
                opts.own_deadline, opts.exec_limit
            )));
        }
        let api = Api::new(
            &opts.base_url,
            &opts.s3_base_url,
            key,
            opts.connect_timeout,
            opts.request_timeout,
        )?;
        Ok(ArchilProvider {
            shared: Arc::new(Shared {
                api,
                opts,
                queues: Default::default(),
            }),
            disk: tokio::sync::OnceCell::new(),
            disk_named: disk,
        })
    }

    /// The work disk's id (`dsk-…`), however [`ArchilOptions::disk`] named it, checked to be
    /// there and available. Looked up once per provider.
    ///
    /// ```no_run
    /// # async fn f(p: &agentbox_providers::archil::ArchilProvider) -> agentbox_core::Result<()> {
    /// let id = p.disk_id(&agentbox_core::Ctx::background()).await?;
    /// assert!(id.starts_with("dsk-"));
    /// # Ok(()) }
    /// ```
    pub async fn disk_id(&self, ctx: &Ctx) -> Result<String> {
        self.disk(ctx).await
    }

    async fn disk(&self, ctx: &Ctx) -> Result<String> {
        self.disk
            .get_or_try_init(|| async {
                let api = &self.shared.api;
                let d = if self.disk_named.starts_with("dsk-") {
                    api.disk(ctx, &self.disk_named).await?
                } else {
                    api.disk_named(ctx, &self.disk_named).await?.ok_or_else(|| {
                        Error::not_found(format!("ARCHIL_DISK: Archil has no disk named {:?}", self.disk_named))
                    })?
                };
                if d.status != "available" {
                    return Err(Error::refused(format!(
                        "Archil disk {} ({}) is {}, not available",
                        d.id, d.name, d.status
                    )));
                }
                tracing::debug!(disk = %d.id, name = %d.name, region = ?d.region, "archil: the work disk");
                Ok(d.id)
            })
            .await
            .cloned()
    }

    /// The box's own name from its id, refusing another provider's or a malformed one.
    fn name_of(id: &SandboxId) -> Result<String> {
        if id.provider() != NAME {
            return Err(Error::invalid(format!("{id} is not an archil box")));
        }
        let name = id.name();
        if !is_box_name(name) {
            return Err(Error::invalid(format!(
                "{id}: an archil box's id is 16 lowercase hex digits"
            )));
        }
        Ok(name.to_string())
    }

    /// Refuse what the exec container cannot give, past what [`check_spec`] refuses.
    fn check_size(spec: &Spec) -> Result<()> {
        if let Some(c) = spec.cpus
            && c > MAX_CPUS
        {
            return Err(Error::unsupported(format!(
                "spec.cpus: {c}: an Archil exec container has {MAX_CPUS} vCPU"
            )));
        }
        if let Some(m) = spec.memory_mb
            && m > MAX_MEMORY_MB
        {
            return Err(Error::unsupported(format!(
                "spec.memory_mb: {m}: an Archil exec container has {MAX_MEMORY_MB} MiB"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl Provider for ArchilProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            cpus: true,
            memory: true,
            isolation: vec!["vm".into()],
            ..Default::default()
        }
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_spec(spec, &self.honours(), NAME)?;
        Self::check_size(spec)?;
        let disk = self.disk(ctx).await?;
        let name = crate::random::random_hex(8)?;
        let id = SandboxId::new(NAME, &name)?;
        let now = agentbox_core::now_ms();
        let record = Record {
            version: record::VERSION,
            id: name.clone(),
            labels: spec.labels.clone(),
            started_at_ms: now,
            ends_at_ms: now.saturating_add(spec.max_lifetime.as_millis() as u64),
        };
        let ends_at_ms = record.ends_at_ms;
        let span = tracing::info_span!("archil create", box_id = %id, disk = %disk);
        // The record first, then the directory: a list reads directories before records, so
        // it never sweeps the directory of a box being made.
        async {
            if let Err(e) = self.shared.write_record(ctx, &disk, &record).await {
                // The write may have landed with its answer lost: take it back.
                let quick = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = self.shared.api.delete_object(&quick, &disk, &Record::key(&name)).await;
                return Err(e);
            }
            if let Err(e) = self
                .shared
                .api
                .put_object(ctx, &disk, &format!("{BOXES}/{name}/"), b"")
                .await
            {
                let quick = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = self.shared.api.delete_object(&quick, &disk, &Record::key(&name)).await;
                return Err(e.context(format!("making the directory of box {id}")));
            }
            Ok(())
        }
        .instrument(span)
        .await?;
        tracing::info!(box_id = %id, ends_at_ms, "archil: box made");
        Ok(Arc::new(ArchilSandbox::new(self.shared.clone(), disk, id, record)))
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        if id.provider() != NAME {
            return Err(Error::invalid(format!("{id} is not an archil box")));
        }
        // An archil id of another shape names no box this provider could have made.
        let Ok(name) = Self::name_of(id) else {
            return Ok(None);
        };
        let disk = self.disk(ctx).await?;
        let Some(record) = self.shared.read_record(ctx, &disk, &name).await? else {
            return Ok(None);
        };
        let b = ArchilSandbox::new(self.shared.clone(), disk, id.clone(), record);
        if b.past_end() {
            b.end(ctx, "its lifetime passed").await;
            return Ok(None);
        }
        Ok(Some(Arc::new(b)))
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let disk = self.disk(ctx).await?;
        let api = &self.shared.api;
        // Directories before records: a box's record is written before its directory, so a
        // directory seen here with no record below is one whose box ended.
        let dirs = api.list(ctx, &disk, &format!("{BOXES}/")).await?;
        let records = api.list(ctx, &disk, &format!("{RECORDS}/")).await?;
        let mut recorded = std::collections::BTreeSet::new();
        let mut out: Vec<Arc<dyn Sandbox>> = Vec::new();
        for key in &records.keys {
            let Some(name) = key
                .strip_prefix(&format!("{RECORDS}/"))
                .and_then(|k| k.strip_suffix(".json"))
            else {
                continue;
            };
            let Ok(id) = SandboxId::new(NAME, name) else { continue };
            if Self::name_of(&id).is_err() {
                continue;
            }
            recorded.insert(name.to_string());
            let record = match self.shared.read_record(ctx, &disk, name).await {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) if e.code() == agentbox_core::ErrorCode::Invalid => {
                    tracing::warn!(box_id = %id, key = %key, "archil: a record that does not read is passed over (its directory is kept): {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let b = ArchilSandbox::new(self.shared.clone(), disk.clone(), id, record);
            if b.past_end() {
                b.end(ctx, "its lifetime passed").await;
                continue;
            }
            if labels.iter().all(|(k, v)| b.labels().get(k) == Some(v)) {
                out.push(Arc::new(b));
            }
        }
        for prefix in &dirs.prefixes {
            let Some(name) = prefix
                .strip_prefix(&format!("{BOXES}/"))
                .and_then(|p| p.strip_suffix('/'))
            else {
                continue;
            };
            if recorded.contains(name) || !is_box_name(name) {
                continue;
            }
            tracing::info!(disk = %disk, dir = %prefix, "archil: sweeping a box directory with no record");
            if let Err(e) = self.shared.remove_dir(ctx, &disk, name).await {
                tracing::warn!(dir = %prefix, "archil: the sweep left the directory for the next list: {e}");
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_api_is_derived_as_the_sdk_derives_it() {
        assert_eq!(
            s3_url_of("https://control.green.us-east-1.aws.prod.archil.com"),
            "https://s3.green.us-east-1.aws.prod.archil.com"
        );
        assert_eq!(s3_url_of("http://127.0.0.1:9/"), "http://127.0.0.1:9");
        assert!(region_url("mars-1").unwrap_err().message().contains("aws-us-east-1"));
    }

    #[test]
    fn options_name_what_is_missing() {
        let e = ArchilOptions::from_vars(|_| None).unwrap_err();
        assert!(e.message().contains("ARCHIL_REGION"), "{e}");
        let o = ArchilOptions::from_vars(|k| match k {
            "ARCHIL_BASE_URL" => Some("http://127.0.0.1:1".into()),
            _ => None,
        })
        .unwrap();
        let e = ArchilProvider::new(o.clone()).err().unwrap();
        assert!(e.message().contains("ARCHIL_API_KEY"), "{e}");
        let mut o = o;
        o.api_key = Some(ApiKey::new("k"));
        let e = ArchilProvider::new(o.clone()).err().unwrap();
        assert!(e.message().contains("ARCHIL_DISK"), "{e}");
        o.disk = Some("a/b".into());
        assert!(ArchilProvider::new(o).is_err());
    }

    #[test]
    fn ids_are_checked() {
        assert!(ArchilProvider::name_of(&"archil:0123456789abcdef".parse().unwrap()).is_ok());
        for bad in ["archil:0123", "archil:0123456789ABCDEF", "local:0123456789abcdef"] {
            assert!(ArchilProvider::name_of(&bad.parse().unwrap()).is_err(), "{bad}");
        }
    }
}
