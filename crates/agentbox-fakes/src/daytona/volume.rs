//! Volumes, under `/api/volumes`: create, list, get (by id and by name), delete, in the
//! shapes of `daytona_api_client`'s `VolumeDto`; and what a sandbox's create makes of its
//! `volumes` (`SandboxVolume`: `volumeId`, which may be the volume's name, `mountPath`,
//! `subpath`).
//!
//! Each volume is a directory of this machine's (`<volumes dir>/<name>`, see
//! [`FakeDaytonaOptions::volumes_dir`]), bound
//! into a sandbox's box at its mount path, so sandboxes that mount one volume share its files
//! at once. Emulated: a new volume is `pending_create` until [`FakeDaytonaOptions::volume_lag`]
//! passed, then `ready`, and only a ready volume can be mounted (a create naming another is
//! 400), as on the real service; a taken name is 400; a volume is deleted only when ready and
//! mounted by no sandbox (409). A mount path is made where the sandbox can make it: at the
//! top level, or under `/workspace`, `/root` or `/tmp` (the snapshot's own directories are
//! read only here). Left out: the volume's S3 backing and its size.
//!
//! [`FakeDaytonaOptions::volume_lag`]: crate::daytona::FakeDaytonaOptions::volume_lag
//! [`FakeDaytonaOptions::volumes_dir`]: crate::daytona::FakeDaytonaOptions::volumes_dir

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::daytona::error::{DError, DResult, ok};
use crate::daytona::state::{ORGANIZATION, rfc3339, uuid};

/// The most volumes the fake keeps (an organization's quota, in the real service).
const MAX_VOLUMES: usize = 100;

/// One volume.
#[derive(Clone, Debug)]
struct Volume {
    id: String,
    name: String,
    created_at: SystemTime,
    ready_at: Instant,
}

impl Volume {
    fn state(&self) -> &'static str {
        if Instant::now() >= self.ready_at {
            "ready"
        } else {
            "pending_create"
        }
    }

    /// The `VolumeDto`: every field the SDK requires.
    fn dto(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "organizationId": ORGANIZATION,
            "state": self.state(),
            "createdAt": rfc3339(self.created_at),
            "updatedAt": rfc3339(self.created_at),
            "lastUsedAt": null,
            "errorReason": null,
        })
    }
}

/// A sandbox's volume, as its create named it and as the fake binds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mounted {
    pub(crate) volume_id: String,
    pub(crate) mount_path: String,
    pub(crate) subpath: Option<String>,
    /// The directory of this machine bound at `mount_path`.
    pub(crate) source: PathBuf,
}

impl Mounted {
    /// As the Sandbox DTO's `volumes` lists it.
    pub(crate) fn dto(&self) -> Value {
        let mut v = json!({ "volumeId": self.volume_id, "mountPath": self.mount_path });
        if let Some(s) = &self.subpath {
            v["subpath"] = json!(s);
        }
        v
    }
}

/// Every volume of the fake.
pub(crate) struct Volumes {
    dir: PathBuf,
    lag: Duration,
    /// Who owns a volume's directory: the host ids the boxes' root maps to, so every sandbox
    /// writes in it (as every user of a sandbox writes in a real volume).
    owner: (u32, u32),
    all: Mutex<BTreeMap<String, Volume>>,
}

impl Volumes {
    pub(crate) fn new(dir: PathBuf, lag: Duration, owner: (u32, u32)) -> Volumes {
        Volumes {
            dir,
            lag,
            owner,
            all: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Volume>> {
        self.all.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory of this machine that holds the files of the volume called `name`.
    pub(crate) fn dir_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The id of the volume called `name`, if there is one.
    pub(crate) fn id_of(&self, name: &str) -> Option<String> {
        self.lock().values().find(|v| v.name == name).map(|v| v.id.clone())
    }

    fn find(&self, id_or_name: &str) -> Option<Volume> {
        let all = self.lock();
        all.get(id_or_name)
            .or_else(|| all.values().find(|v| v.name == id_or_name))
            .cloned()
    }

    /// `POST /volumes`.
    pub(crate) fn create(&self, body: &Value) -> DResult {
        let name = match body.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(DError::bad_request("name must be a string")),
        };
        if name.is_empty() || name.len() > 255 || name.starts_with('.') {
            return Err(DError::bad_request(
                "name must be 1 to 255 characters, not starting with '.'",
            ));
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(DError::bad_request(format!(
                "Volume name {name:?}: letters, digits, '-', '_' and '.' only"
            )));
        }
        let mut all = self.lock();
        if all.values().any(|v| v.name == name) {
            // The real service's answer to a taken name is a 400, not a 409.
            return Err(DError::bad_request(format!("Volume with name {name} already exists")));
        }
        if all.len() >= MAX_VOLUMES {
            return Err(DError::api(
                403,
                "FORBIDDEN",
                format!("Volume quota exceeded: at most {MAX_VOLUMES}"),
            ));
        }
        let id = uuid();
        let dir = self.dir_of(&name);
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::os::unix::fs::chown(&dir, Some(self.owner.0), Some(self.owner.1)))
            .map_err(|e| {
                DError::internal(
                    format!("the volume's directory: {e}"),
                    crate::daytona::error::Source::Api,
                )
            })?;
        let v = Volume {
            id: id.clone(),
            name,
            created_at: SystemTime::now(),
            ready_at: Instant::now() + self.lag,
        };
        let dto = v.dto();
        tracing::info!(volume = %id, name = %v.name, "volume created");
        all.insert(id, v);
        ok(dto)
    }

    /// `GET /volumes`.
    pub(crate) fn list(&self) -> DResult {
        ok(Value::Array(self.lock().values().map(Volume::dto).collect()))
    }

    /// `GET /volumes/{id}`.
    pub(crate) fn get(&self, id: &str) -> DResult {
        let all = self.lock();
        let v = all
            .get(id)
            .ok_or_else(|| DError::api(404, "NOT_FOUND", format!("Volume with ID {id} not found")))?;
        ok(v.dto())
    }

    /// `GET /volumes/by-name/{name}`.
    pub(crate) fn by_name(&self, name: &str) -> DResult {
        let all = self.lock();
        let v = all
            .values()
            .find(|v| v.name == name)
            .ok_or_else(|| DError::api(404, "NOT_FOUND", format!("Volume with name {name} not found")))?;
        ok(v.dto())
    }

    /// `DELETE /volumes/{id}`: its files go with it. `in_use` names a sandbox that mounts it.
    pub(crate) fn delete(&self, id: &str, in_use: Option<String>) -> DResult {
        let mut all = self.lock();
        if !all.contains_key(id) {
            return Err(DError::api(404, "NOT_FOUND", format!("Volume with ID {id} not found")));
        }
        if let Some(s) = in_use {
            return Err(DError::api(
                409,
                "CONFLICT",
                format!("Volume {id} is in use by sandbox {s}"),
            ));
        }
        if all.get(id).is_some_and(|v| v.state() != "ready") {
            return Err(DError::bad_request(format!(
                "Volume {id} must be in a ready or error state to be deleted"
            )));
        }
        let Some(v) = all.remove(id) else {
            return ok(Value::Null);
        };
        drop(all);
        if let Err(e) = std::fs::remove_dir_all(self.dir_of(&v.name)) {
            tracing::warn!(volume = %id, "removing the volume's directory: {e}");
        }
        ok(Value::Null)
    }

    /// A create's `volumes`, checked: each names a ready volume (by id or name) and an
    /// absolute mount path of its own; a subpath is a relative path in the volume, made when
    /// missing.
    pub(crate) fn mounts(&self, body: &Value) -> Result<Vec<Mounted>, DError> {
        let list = match body.get("volumes") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(DError::bad_request("volumes must be an array")),
        };
        let mut out: Vec<Mounted> = Vec::new();
        for (i, m) in list.iter().enumerate() {
            let field = |f: &str| match m.get(f) {
                Some(Value::String(s)) => Ok(Some(s.clone())),
                None | Some(Value::Null) => Ok(None),
                Some(_) => Err(DError::bad_request(format!("volumes[{i}].{f} must be a string"))),
            };
            let id =
                field("volumeId")?.ok_or_else(|| DError::bad_request(format!("volumes[{i}].volumeId is required")))?;
            let path = field("mountPath")?
                .ok_or_else(|| DError::bad_request(format!("volumes[{i}].mountPath is required")))?;
            let subpath = field("subpath")?.filter(|s| !s.is_empty());
            if !path.starts_with('/') || path == "/" || path.split('/').any(|c| c == "..") {
                return Err(DError::bad_request(format!(
                    "volumes[{i}].mountPath {path:?}: an absolute path other than /, with no '..'"
                )));
            }
            if out.iter().any(|o| o.mount_path == path) {
                return Err(DError::bad_request(format!(
                    "volumes[{i}].mountPath {path:?}: given twice"
                )));
            }
            let v = self
                .find(&id)
                .ok_or_else(|| DError::api(404, "NOT_FOUND", format!("Volume {id} not found")))?;
            if v.state() != "ready" {
                return Err(DError::bad_request(format!(
                    "Volume {} is not in a ready state (state: {})",
                    v.name,
                    v.state()
                )));
            }
            let mut source = self.dir_of(&v.name);
            if let Some(s) = &subpath {
                if s.starts_with('/') || s.split('/').any(|c| c == ".." || c == ".") {
                    return Err(DError::bad_request(format!(
                        "volumes[{i}].subpath {s:?}: a relative path in the volume, with no '.' or '..'"
                    )));
                }
                source = source.join(s);
                std::fs::create_dir_all(&source)
                    .and_then(|_| std::os::unix::fs::chown(&source, Some(self.owner.0), Some(self.owner.1)))
                    .map_err(|e| {
                        DError::internal(format!("the volume's subpath: {e}"), crate::daytona::error::Source::Api)
                    })?;
            }
            out.push(Mounted {
                volume_id: v.id,
                mount_path: path,
                subpath,
                source,
            });
        }
        Ok(out)
    }
}
