//! What every request handler shares: the disks (their records, and their directories under
//! the fake's root), the checkouts, the boxes of execs under way, the scripted faults and the
//! log of requests.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agentbox_core::{Ctx, Provider, Sandbox};
use agentbox_providers::namespace::NamespaceProvider;
use serde_json::{Value, json};

use crate::archil::RecordedRequest;
use crate::archil::checkout::Checkouts;
use crate::archil::files::Owner;

/// The organization every disk belongs to.
pub(crate) const ORGANIZATION: &str = "org-fake";
/// How many requests the log keeps (the oldest let go).
pub(crate) const MAX_RECORDED: usize = 10_000;
/// How much of a request's body the log keeps.
pub(crate) const MAX_RECORDED_BODY: usize = 64 << 10;

/// One disk.
#[derive(Clone, Debug)]
pub(crate) struct Disk {
    pub(crate) id: String,
    pub(crate) name: String,
    /// Its place in creation order: what a listing is sorted and paged by.
    pub(crate) seq: u64,
    pub(crate) created_at: SystemTime,
    pub(crate) allowed_ips: Vec<String>,
    pub(crate) root_attrs: Option<Value>,
}

/// A fault scripted by [`crate::archil::FakeArchil::fail_next`].
pub(crate) struct Fault {
    pub(crate) method: String,
    pub(crate) path_prefix: String,
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) left: usize,
}

pub(crate) struct Shared {
    /// The key without any `key-` prefix (see `authorized`).
    pub(crate) api_key: String,
    pub(crate) region: String,
    /// Where disks live, one directory each, canonical.
    pub(crate) root: PathBuf,
    /// Where each exec's `/mnt` is staged, canonical.
    pub(crate) staging: PathBuf,
    pub(crate) rootfs: Option<PathBuf>,
    pub(crate) exec_limit: Duration,
    pub(crate) owner: Owner,
    pub(crate) provider: Arc<NamespaceProvider>,
    pub(crate) disks: Mutex<BTreeMap<String, Disk>>,
    pub(crate) next_seq: AtomicU64,
    pub(crate) checkouts: Arc<Checkouts>,
    /// The boxes of execs under way, by their container id, so a shutdown ends them.
    pub(crate) boxes: Mutex<BTreeMap<String, Arc<dyn Sandbox>>>,
    /// How many execs may run at once (past it: 503 `no_capacity`).
    pub(crate) exec_slots: Arc<tokio::sync::Semaphore>,
    pub(crate) faults: Mutex<Vec<Fault>>,
    pub(crate) requests: Mutex<VecDeque<RecordedRequest>>,
}

impl Shared {
    pub(crate) fn disk(&self, id: &str) -> Option<Disk> {
        self.disks.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub(crate) fn disk_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The provider a disk's record names: the cloud of its region.
    pub(crate) fn cloud(&self) -> &str {
        match self.region.split('-').next() {
            Some("aws") => "aws",
            Some("gcp") => "gcp",
            Some("azure") => "azure",
            _ => "archil",
        }
    }

    /// The DiskResponse (`archil_openapi` `DiskResponse`; every field `DiskData.from_json`
    /// requires, and `sandboxDisk`, which the openapi model requires).
    pub(crate) fn disk_json(&self, d: &Disk) -> Value {
        let mut v = json!({
            "id": d.id,
            "name": d.name,
            "organization": ORGANIZATION,
            "status": "available",
            "provider": self.cloud(),
            "region": self.region,
            "createdAt": rfc3339(d.created_at),
            "sandboxDisk": false,
            "fsHandlerStatus": "running",
            "mounts": [],
            "authorizedUsers": [],
            "allowedIps": d.allowed_ips,
        });
        if let Some(a) = &d.root_attrs {
            v["rootAttrs"] = a.clone();
        }
        v
    }

    /// Note one request in the log, its body cut at [`MAX_RECORDED_BODY`].
    pub(crate) fn record(&self, method: &str, path: &str, body: &[u8]) {
        let cut = &body[..body.len().min(MAX_RECORDED_BODY)];
        let mut r = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        if r.len() >= MAX_RECORDED {
            r.pop_front();
        }
        r.push_back(RecordedRequest {
            method: method.to_string(),
            path: path.to_string(),
            body: String::from_utf8_lossy(cut).into_owned(),
        });
    }

    /// The scripted fault this request meets, if any (spending one of its count).
    pub(crate) fn fault(&self, method: &str, path: &str) -> Option<(u16, String, String)> {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let i = f.iter().position(|x| {
            (x.method == "*" || x.method.eq_ignore_ascii_case(method)) && path.starts_with(&x.path_prefix)
        })?;
        let hit = (f[i].status, f[i].code.clone(), f[i].message.clone());
        f[i].left -= 1;
        if f[i].left == 0 {
            f.remove(i);
        }
        Some(hit)
    }

    /// End every exec's box (the fake shuts down), and any box of this fake's provider left.
    pub(crate) async fn end_all(&self) {
        let boxes: Vec<Arc<dyn Sandbox>> = std::mem::take(&mut *self.boxes.lock().unwrap_or_else(|p| p.into_inner()))
            .into_values()
            .collect();
        let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
        for b in boxes {
            let _ = b.destroy(&ctx).await;
        }
        if let Ok(left) = self.provider.list(&Default::default(), &ctx).await {
            for b in left {
                let _ = b.destroy(&ctx).await;
            }
        }
    }
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    agentbox_core::rfc3339(agentbox_core::epoch_ms(t))
}

/// An HTTP date (`Last-Modified`): `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn http_date(t: SystemTime) -> String {
    agentbox_core::http_date(agentbox_core::epoch_ms(t))
}

/// `prefix` and 16 random hex digits, as Archil's ids (`dsk-0123456789abcdef`).
pub(crate) fn random_id(prefix: &str) -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}{h}")
}
