//! `modal.client.ModalClient`: the calls the Python SDK makes to start, look up an app, build
//! (record) an image, make a secret of a sandbox's `env`, and run sandboxes; every other call
//! answers `UNIMPLEMENTED`. The tokens are checked before any of these (see `mod.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, Lifecycle, Mount, Network, Provider, Spec};
use agentbox_modal_proto::client as pb;
use agentbox_modal_proto::client::generic_result::GenericStatus;
use agentbox_modal_proto::client::modal_client_server::ModalClient;
use agentbox_modal_proto::client::network_access::NetworkAccessType;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::modal::state::{App, BOX_TIMEOUT, Image, Sbx, Shared, lock, modal_id, now_secs, result};

/// The longest sandbox Modal runs (24 h).
const MAX_TIMEOUT_SECS: u32 = 86_400;
/// A sandbox's lifetime unless told.
const DEFAULT_TIMEOUT_SECS: u32 = 300;
/// The image builder version environments report.
const BUILDER_VERSION: &str = "2024.10";
/// Where a GPU sandbox's `nvidia-smi` is (on its PATH).
const GPU_BIN_MOUNT: &str = "/nvidia";

pub(crate) struct Client(pub(crate) Arc<Shared>);

type R<T> = Result<Response<T>, Status>;

fn env_name(n: &str) -> String {
    if n.is_empty() { "main".into() } else { n.to_string() }
}

fn metadata(s: &Sbx) -> pb::SandboxHandleMetadata {
    pb::SandboxHandleMetadata {
        result: s.result(),
        app_id: s.app_id.clone(),
    }
}

fn tags_of(t: &[pb::SandboxTag]) -> Vec<(String, String)> {
    let mut m = BTreeMap::new();
    for x in t {
        m.insert(x.tag_name.clone(), x.tag_value.clone());
    }
    m.into_iter().collect()
}

fn tag_protos(t: &[(String, String)]) -> Vec<pb::SandboxTag> {
    t.iter()
        .map(|(k, v)| pb::SandboxTag {
            tag_name: k.clone(),
            tag_value: v.clone(),
        })
        .collect()
}

/// A seconds value from a float timeout, at most `max` (a negative or NaN one is zero).
fn secs(t: f32, max: Duration) -> Duration {
    if t.is_finite() && t > 0.0 {
        Duration::from_secs_f32(t).min(max)
    } else {
        Duration::ZERO
    }
}

impl Client {
    fn app_exists(&self, id: &str) -> Result<(), Status> {
        if lock(&self.0.records).apps.contains_key(id) {
            Ok(())
        } else {
            Err(Status::not_found(format!("App {id} not found")))
        }
    }

    /// Make the sandbox: its box, its entrypoint, its supervisor.
    async fn create(&self, req: pb::SandboxCreateRequest) -> Result<Arc<Sbx>, Status> {
        let s = &self.0;
        let d = req
            .definition
            .ok_or_else(|| Status::invalid_argument("definition: required"))?;
        self.app_exists(&req.app_id)?;
        let timeout_secs = if d.timeout_secs == 0 {
            DEFAULT_TIMEOUT_SECS
        } else {
            d.timeout_secs
        };
        if timeout_secs > MAX_TIMEOUT_SECS {
            return Err(Status::invalid_argument(format!(
                "timeout_secs {timeout_secs}: at most {MAX_TIMEOUT_SECS} (24 hours)"
            )));
        }
        let runtime = d.runtime.clone().unwrap_or_default();
        if !runtime.is_empty() && runtime != "gvisor" && runtime != "vm" && runtime != "runc" {
            return Err(Status::invalid_argument(format!("runtime {runtime:?}: gvisor or vm")));
        }
        let snapshot = {
            let r = lock(&s.records);
            match r.images.get(&d.image_id) {
                Some(i) => i.snapshot.clone(),
                None if d.image_id.is_empty() => None,
                None => return Err(Status::not_found(format!("Image {} not found", d.image_id))),
            }
        };
        let mut env = BTreeMap::new();
        {
            let r = lock(&s.records);
            for id in &d.secret_ids {
                let e = r
                    .secrets
                    .get(id)
                    .ok_or_else(|| Status::not_found(format!("Secret {id} not found")))?;
                env.extend(e.clone());
            }
        }
        if let Some(m) = &d.environment_variables {
            env.extend(m.contents.clone());
        }
        let network = d
            .network_access
            .as_ref()
            .map(|n| n.network_access_type())
            .unwrap_or(NetworkAccessType::Unspecified);
        // An allowlist cannot be enforced here: the box gets no network at all (fail closed).
        let network_none =
            d.block_network || matches!(network, NetworkAccessType::Blocked | NetworkAccessType::Allowlist);
        let ports: Vec<(u32, bool)> = match &d.open_ports_oneof {
            Some(pb::sandbox::OpenPortsOneof::OpenPorts(p)) => {
                p.ports.iter().map(|x| (x.port, x.unencrypted)).collect()
            }
            None => Vec::new(),
        };
        if network_none && !ports.is_empty() {
            return Err(Status::invalid_argument("open ports need network access"));
        }
        if ports.iter().any(|(p, _)| *p == 0 || *p > 65535) {
            return Err(Status::invalid_argument("open_ports: a port is 1 to 65535"));
        }
        let gpu = d
            .resources
            .as_ref()
            .and_then(|r| r.gpu_config.as_ref())
            .filter(|g| !g.gpu_type.is_empty() || g.count > 0)
            .map(|g| g.gpu_type.clone());
        if !d.name.as_deref().unwrap_or("").is_empty() {
            let r = lock(&s.records);
            let name = d.name.as_deref().unwrap_or("");
            if r.sandboxes
                .values()
                .any(|x| x.app_id == req.app_id && x.name == name && x.result().is_none())
            {
                return Err(Status::already_exists(format!(
                    "a running Sandbox of this App is named {name:?}"
                )));
            }
        }
        let id = modal_id("sb-");
        let mut spec = Spec::new(Duration::from_secs(u64::from(timeout_secs)) + BOX_TIMEOUT * 2);
        spec.image = s.rootfs.as_ref().map(|r| r.to_string_lossy().into_owned());
        spec.snapshot = snapshot;
        // A sandbox's tunnels reach its ports on this machine's loopback: the box shares this
        // machine's network unless it is blocked.
        spec.network = Some(if network_none { Network::None } else { Network::Host });
        spec.env = env.clone();
        if let Some(g) = &gpu {
            let dir = s.dir.join("gpu").join(&id);
            let bin = dir.join("bin");
            let names = s
                .gpus
                .iter()
                .find(|(t, _)| t.eq_ignore_ascii_case(g))
                .map(|(_, n)| n.clone())
                .unwrap_or_default();
            write_nvidia_smi(&bin, &names).map_err(|e| Status::internal(format!("the GPU's nvidia-smi: {e}")))?;
            spec.mounts.push(Mount {
                source: dir.to_string_lossy().into_owned(),
                target: GPU_BIN_MOUNT.into(),
                read_only: true,
            });
            let path = env
                .get("PATH")
                .cloned()
                .unwrap_or_else(|| agentbox_providers::namespace::DEFAULT_PATH.to_string());
            spec.env.insert("PATH".into(), format!("{path}:{GPU_BIN_MOUNT}/bin"));
        }
        let b = s
            .provider
            .create(&spec, &Ctx::background().with_timeout(BOX_TIMEOUT))
            .await
            .map_err(|e| Status::internal(format!("the sandbox's container could not be made: {}", e.message())))?;
        if runtime == "vm" && s.fuse {
            // A stand-in for a VM's /dev/fuse: the host's device is its root's alone, which no
            // box's root is, and a device bound into a box is nodev. A link to the box's own
            // /dev/null is a character device root opens: a client's check passes, a FUSE
            // mount would not.
            let argv = ["ln", "-s", "/dev/null", "/dev/fuse"].map(String::from);
            let linked = match b
                .exec(
                    &argv,
                    &ExecOptions::default(),
                    &Ctx::background().with_timeout(BOX_TIMEOUT),
                )
                .await
            {
                Ok(p) => agentbox_core::finish(p, agentbox_core::FinishOptions::default())
                    .await
                    .map(|o| o.status.code),
                Err(e) => Err(e),
            };
            if !matches!(linked, Ok(0)) {
                let _ = b.destroy(&Ctx::background()).await;
                return Err(Status::internal(format!(
                    "the VM's /dev/fuse could not be made: {linked:?}"
                )));
            }
        }
        let mut jwt_secret = [0u8; 24];
        let _ = getrandom::fill(&mut jwt_secret);
        let task_id = modal_id("ta-");
        let jwt = jwt(&task_id, &jwt_secret);
        let created_at = {
            let mut r = lock(&s.records);
            let t = now_secs().max(r.last_created + 1e-3);
            r.last_created = t;
            t
        };
        let sbx = Arc::new(Sbx {
            id: id.clone(),
            app_id: req.app_id.clone(),
            task_id: task_id.clone(),
            jwt,
            created_at,
            timeout_secs,
            name: d.name.clone().unwrap_or_default(),
            image_id: d.image_id.clone(),
            ports,
            workdir: d.workdir.clone().filter(|w| !w.is_empty()),
            gpu_type: gpu.unwrap_or_default(),
            tags: std::sync::Mutex::new(tags_of(&req.tags)),
            boxed: std::sync::Mutex::new(Some(b.clone())),
            result: tokio::sync::watch::channel(None).0,
            execs: Default::default(),
            definition: d.clone(),
        });
        {
            let mut r = lock(&s.records);
            r.sandboxes.insert(id.clone(), sbx.clone());
            r.tasks.insert(task_id, id.clone());
        }
        let entry = if d.entrypoint_args.is_empty() {
            None
        } else {
            let opts = ExecOptions {
                cwd: sbx.workdir.clone(),
                ..Default::default()
            };
            match b.exec(&d.entrypoint_args, &opts, &Ctx::background()).await {
                Ok(p) => Some(p),
                Err(e) => {
                    sbx.end(result(
                        GenericStatus::Failure,
                        127,
                        &format!("the entrypoint could not start: {}", e.message()),
                    ));
                    None
                }
            }
        };
        if sbx.result().is_none() {
            crate::modal::state::supervise(sbx.clone(), entry);
        }
        Ok(sbx)
    }

    fn info(&self, x: &Sbx) -> pb::SandboxInfo {
        let r = x.result();
        pb::SandboxInfo {
            id: x.id.clone(),
            created_at: x.created_at,
            app_id: x.app_id.clone(),
            tags: tag_protos(&lock(&x.tags)),
            name: x.name.clone(),
            image_id: x.image_id.clone(),
            timeout_secs: x.timeout_secs,
            task_info: Some(pb::TaskInfo {
                id: x.task_id.clone(),
                started_at: x.created_at,
                result: r,
                sandbox_id: x.id.clone(),
                gpu_type: x.gpu_type.clone(),
                ..Default::default()
            }),
            metadata: Some(metadata(x)),
            ..Default::default()
        }
    }

    async fn snapshot(&self, x: &Sbx) -> Result<String, Status> {
        snapshot_fs(&self.0, x).await
    }
}

/// Take the box's files as they are into a new image; its id.
pub(crate) async fn snapshot_fs(s: &Shared, x: &Sbx) -> Result<String, Status> {
    let b = x
        .running_box()
        .ok_or_else(|| Status::failed_precondition(format!("Sandbox {} has already finished", x.id)))?;
    let image_id = modal_id("im-");
    let name = format!("modal-{}", image_id.to_ascii_lowercase().replace('_', "-"));
    s.provider
        .snapshot(b.id(), &name, &Ctx::background().with_timeout(Duration::from_secs(300)))
        .await
        .map_err(|e| Status::internal(format!("snapshotting the sandbox's files: {}", e.message())))?;
    lock(&s.records).images.insert(
        image_id.clone(),
        Image {
            commands: Vec::new(),
            snapshot: Some(name),
        },
    );
    Ok(image_id)
}

/// A JWT-shaped token (the SDK reads its `exp`, unverified): random, per task.
fn jwt(task_id: &str, secret: &[u8]) -> String {
    let exp = now_secs() as u64 + 24 * 3600;
    let header = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = b64url(format!(r#"{{"task_id":"{task_id}","exp":{exp}}}"#).as_bytes());
    format!("{header}.{payload}.{}", b64url(secret))
}

fn b64url(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// `bin/nvidia-smi` printing `names`, one a line, for `--query-gpu=name` (nothing for none).
fn write_nvidia_smi(bin: &std::path::Path, names: &[String]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(bin)?;
    let mut quoted = String::new();
    for n in names {
        quoted.push_str(&format!(" '{}'", n.replace('\'', "'\\''")));
    }
    let script = format!(
        "#!/bin/sh\n# The fake Modal's nvidia-smi: the GPUs the test scripted.\nset --{quoted} -- \"$@\"\n\
         names=\"\"\nwhile [ \"$1\" != \"--\" ]; do names=\"$names$1\n\"; shift; done\nshift\n\
         case \"$*\" in\n  *--query-gpu=name*) printf '%s' \"$names\" ;;\n\
           *) printf 'NVIDIA-SMI (agentbox fake)\\n'; printf '%s' \"$names\" ;;\nesac\nexit 0\n"
    );
    let f = bin.join("nvidia-smi");
    std::fs::write(&f, script)?;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755))?;
    for d in [bin, bin.parent().unwrap_or(bin)] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    if let Some(g) = bin.parent().and_then(|p| p.parent()) {
        std::fs::set_permissions(g, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

#[tonic::async_trait]
impl ModalClient for Client {
    async fn client_hello(&self, _r: Request<()>) -> R<pb::ClientHelloResponse> {
        self.0.enter("ClientHello", None, None, None)?;
        Ok(Response::new(pb::ClientHelloResponse::default()))
    }

    async fn environment_get_or_create(
        &self,
        r: Request<pb::EnvironmentGetOrCreateRequest>,
    ) -> R<pb::EnvironmentGetOrCreateResponse> {
        self.0.enter("EnvironmentGetOrCreate", None, None, None)?;
        let name = env_name(&r.get_ref().deployment_name);
        let id = lock(&self.0.records)
            .envs
            .entry(name.clone())
            .or_insert_with(|| modal_id("en-"))
            .clone();
        Ok(Response::new(pb::EnvironmentGetOrCreateResponse {
            environment_id: id,
            metadata: Some(pb::EnvironmentMetadata {
                name,
                settings: Some(pb::EnvironmentSettings {
                    image_builder_version: BUILDER_VERSION.into(),
                    webhook_suffix: "modal.run".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }))
    }

    async fn app_get_or_create(&self, r: Request<pb::AppGetOrCreateRequest>) -> R<pb::AppGetOrCreateResponse> {
        self.0.enter("AppGetOrCreate", None, None, None)?;
        let q = r.into_inner();
        if q.app_name.is_empty() {
            return Err(Status::invalid_argument("app_name: required"));
        }
        let key = (env_name(&q.environment_name), q.app_name.clone());
        let mut rec = lock(&self.0.records);
        if let Some(id) = rec.app_names.get(&key) {
            if q.object_creation_type == pb::ObjectCreationType::CreateFailIfExists as i32 {
                return Err(Status::already_exists(format!("App {:?} already exists", q.app_name)));
            }
            return Ok(Response::new(pb::AppGetOrCreateResponse {
                app_id: id.clone(),
                ..Default::default()
            }));
        }
        let create = q.object_creation_type == pb::ObjectCreationType::CreateIfMissing as i32
            || q.object_creation_type == pb::ObjectCreationType::CreateFailIfExists as i32;
        if !create {
            return Err(Status::not_found(format!(
                "App {:?} not found in environment {:?}",
                q.app_name, key.0
            )));
        }
        let id = modal_id("ap-");
        rec.app_names.insert(key, id.clone());
        rec.apps.insert(id.clone(), App { tags: HashMap::new() });
        Ok(Response::new(pb::AppGetOrCreateResponse {
            app_id: id,
            ..Default::default()
        }))
    }

    async fn app_get_tags(&self, r: Request<pb::AppGetTagsRequest>) -> R<pb::AppGetTagsResponse> {
        self.0.enter("AppGetTags", None, None, None)?;
        let id = &r.get_ref().app_id;
        let rec = lock(&self.0.records);
        let a = rec
            .apps
            .get(id)
            .ok_or_else(|| Status::not_found(format!("App {id} not found")))?;
        Ok(Response::new(pb::AppGetTagsResponse { tags: a.tags.clone() }))
    }

    async fn app_set_tags(&self, r: Request<pb::AppSetTagsRequest>) -> R<()> {
        self.0.enter("AppSetTags", None, None, None)?;
        let q = r.into_inner();
        let mut rec = lock(&self.0.records);
        let a = rec
            .apps
            .get_mut(&q.app_id)
            .ok_or_else(|| Status::not_found(format!("App {} not found", q.app_id)))?;
        // The whole set, replaced (the SDK: "this method does not have `.update()` semantics").
        a.tags = q.tags;
        Ok(Response::new(()))
    }

    async fn secret_get_or_create(&self, r: Request<pb::SecretGetOrCreateRequest>) -> R<pb::SecretGetOrCreateResponse> {
        self.0.enter("SecretGetOrCreate", None, None, None)?;
        let q = r.into_inner();
        let env: BTreeMap<String, String> = q.env_dict.into_iter().collect();
        let mut rec = lock(&self.0.records);
        let id = if q.deployment_name.is_empty() {
            let id = modal_id("st-");
            rec.secrets.insert(id.clone(), env);
            id
        } else {
            let key = (env_name(&q.environment_name), q.deployment_name.clone());
            match rec.secret_names.get(&key).cloned() {
                Some(id) if q.object_creation_type != pb::ObjectCreationType::CreateOverwriteIfExists as i32 => id,
                found => {
                    let creates = q.object_creation_type != pb::ObjectCreationType::Unspecified as i32;
                    if found.is_none() && !creates {
                        return Err(Status::not_found(format!("Secret {:?} not found", q.deployment_name)));
                    }
                    let id = found.unwrap_or_else(|| modal_id("st-"));
                    rec.secrets.insert(id.clone(), env);
                    rec.secret_names.insert(key, id.clone());
                    id
                }
            }
        };
        Ok(Response::new(pb::SecretGetOrCreateResponse {
            secret_id: id,
            metadata: None,
        }))
    }

    async fn image_get_or_create(&self, r: Request<pb::ImageGetOrCreateRequest>) -> R<pb::ImageGetOrCreateResponse> {
        self.0.enter("ImageGetOrCreate", None, None, None)?;
        let q = r.into_inner();
        let commands = q.image.map(|i| i.dockerfile_commands).unwrap_or_default();
        let mut rec = lock(&self.0.records);
        // The same definition is the same image (Modal's cache hit).
        let found = rec
            .images
            .iter()
            .find(|(_, i)| i.snapshot.is_none() && i.commands == commands)
            .map(|(id, _)| id.clone());
        let id = found.unwrap_or_else(|| {
            let id = modal_id("im-");
            rec.images.insert(
                id.clone(),
                Image {
                    commands,
                    snapshot: None,
                },
            );
            id
        });
        Ok(Response::new(pb::ImageGetOrCreateResponse {
            image_id: id,
            result: Some(result(GenericStatus::Success, 0, "")),
            metadata: Some(pb::ImageMetadata {
                image_builder_version: Some(BUILDER_VERSION.into()),
                ..Default::default()
            }),
        }))
    }

    async fn image_join_streaming(
        &self,
        r: Request<pb::ImageJoinStreamingRequest>,
    ) -> R<BoxStream<pb::ImageJoinStreamingResponse>> {
        self.0.enter("ImageJoinStreaming", None, None, None)?;
        let id = &r.get_ref().image_id;
        if !lock(&self.0.records).images.contains_key(id) {
            return Err(Status::not_found(format!("Image {id} not found")));
        }
        let one = pb::ImageJoinStreamingResponse {
            result: Some(result(GenericStatus::Success, 0, "")),
            eof: true,
            entry_id: "0".into(),
            ..Default::default()
        };
        Ok(Response::new(Box::pin(futures_util::stream::iter([Ok(one)]))))
    }

    async fn image_from_id(&self, r: Request<pb::ImageFromIdRequest>) -> R<pb::ImageFromIdResponse> {
        self.0.enter("ImageFromId", None, None, None)?;
        let id = r.into_inner().image_id;
        if !lock(&self.0.records).images.contains_key(&id) {
            return Err(Status::not_found(format!("Image {id} not found")));
        }
        Ok(Response::new(pb::ImageFromIdResponse {
            image_id: id,
            ..Default::default()
        }))
    }

    async fn image_delete(&self, r: Request<pb::ImageDeleteRequest>) -> R<()> {
        self.0.enter("ImageDelete", None, None, None)?;
        let id = r.into_inner().image_id;
        let img = lock(&self.0.records)
            .images
            .remove(&id)
            .ok_or_else(|| Status::not_found(format!("Image {id} not found")))?;
        if let Some(name) = img.snapshot {
            let _ = self
                .0
                .provider
                .delete_snapshot(&name, &Ctx::background().with_timeout(BOX_TIMEOUT))
                .await;
        }
        Ok(Response::new(()))
    }

    async fn sandbox_create(&self, r: Request<pb::SandboxCreateRequest>) -> R<pb::SandboxCreateResponse> {
        self.0.enter("SandboxCreate", None, None, None)?;
        let x = self.create(r.into_inner()).await?;
        Ok(Response::new(pb::SandboxCreateResponse {
            sandbox_id: x.id.clone(),
            metadata: Some(metadata(&x)),
        }))
    }

    async fn sandbox_get_task_id(&self, r: Request<pb::SandboxGetTaskIdRequest>) -> R<pb::SandboxGetTaskIdResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxGetTaskId", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        Ok(Response::new(match x.result() {
            Some(res) => pb::SandboxGetTaskIdResponse {
                task_id: None,
                task_result: Some(res),
            },
            None => pb::SandboxGetTaskIdResponse {
                task_id: Some(x.task_id.clone()),
                task_result: None,
            },
        }))
    }

    async fn task_get_command_router_access(
        &self,
        r: Request<pb::TaskGetCommandRouterAccessRequest>,
    ) -> R<pb::TaskGetCommandRouterAccessResponse> {
        let q = r.into_inner();
        let sid = lock(&self.0.records).tasks.get(&q.task_id).cloned();
        self.0
            .enter("TaskGetCommandRouterAccess", sid.as_deref(), Some(&q.task_id), None)?;
        let sid = sid.ok_or_else(|| Status::not_found(format!("Task {} not found", q.task_id)))?;
        let x = self.0.sandbox(&sid)?;
        if x.result().is_some() {
            return Err(Status::not_found(format!("Task {} has finished", q.task_id)));
        }
        Ok(Response::new(pb::TaskGetCommandRouterAccessResponse {
            jwt: x.jwt.clone(),
            url: self.0.url.clone(),
        }))
    }

    async fn sandbox_wait(&self, r: Request<pb::SandboxWaitRequest>) -> R<pb::SandboxWaitResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxWait", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        let res = x.wait(secs(q.timeout, self.0.max_wait)).await;
        Ok(Response::new(pb::SandboxWaitResponse {
            result: res,
            metadata: Some(metadata(&x)),
        }))
    }

    async fn sandbox_list(&self, r: Request<pb::SandboxListRequest>) -> R<pb::SandboxListResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxList", None, None, None)?;
        if !q.app_id.is_empty() {
            self.app_exists(&q.app_id)?;
        }
        let want = tags_of(&q.tags);
        let rec = lock(&self.0.records);
        let env_apps: Option<Vec<String>> = (q.app_id.is_empty() && !q.environment_name.is_empty()).then(|| {
            let env = env_name(&q.environment_name);
            rec.app_names
                .iter()
                .filter(|((e, _), _)| *e == env)
                .map(|(_, id)| id.clone())
                .collect()
        });
        let mut all: Vec<&Arc<Sbx>> = rec
            .sandboxes
            .values()
            .filter(|x| q.app_id.is_empty() || x.app_id == q.app_id)
            .filter(|x| env_apps.as_ref().is_none_or(|a| a.contains(&x.app_id)))
            .filter(|x| q.include_finished || x.result().is_none())
            .filter(|x| q.before_timestamp == 0.0 || x.created_at < q.before_timestamp)
            .filter(|x| {
                let have = lock(&x.tags);
                want.iter().all(|w| have.contains(w))
            })
            .collect();
        all.sort_by(|a, b| b.created_at.total_cmp(&a.created_at));
        let sandboxes = all.into_iter().take(self.0.list_page).map(|x| self.info(x)).collect();
        Ok(Response::new(pb::SandboxListResponse { sandboxes }))
    }

    async fn sandbox_terminate(&self, r: Request<pb::SandboxTerminateRequest>) -> R<pb::SandboxTerminateResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxTerminate", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        let before = x.result();
        x.end(result(GenericStatus::Terminated, 137, "Sandbox terminated"));
        Ok(Response::new(pb::SandboxTerminateResponse {
            existing_result: before,
        }))
    }

    async fn sandbox_tags_set(&self, r: Request<pb::SandboxTagsSetRequest>) -> R<()> {
        let q = r.into_inner();
        self.0.enter("SandboxTagsSet", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        // The whole set, replaced (the SDK: "Setting tags replaces the Sandbox's entire tag set").
        *lock(&x.tags) = tags_of(&q.tags);
        Ok(Response::new(()))
    }

    async fn sandbox_tags_get(&self, r: Request<pb::SandboxTagsGetRequest>) -> R<pb::SandboxTagsGetResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxTagsGet", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        let tags = tag_protos(&lock(&x.tags));
        Ok(Response::new(pb::SandboxTagsGetResponse { tags }))
    }

    async fn sandbox_snapshot_fs(&self, r: Request<pb::SandboxSnapshotFsRequest>) -> R<pb::SandboxSnapshotFsResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxSnapshotFs", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        let image_id = self.snapshot(&x).await?;
        Ok(Response::new(pb::SandboxSnapshotFsResponse {
            image_id,
            result: Some(result(GenericStatus::Success, 0, "")),
            image_metadata: Some(pb::ImageMetadata {
                image_builder_version: Some(BUILDER_VERSION.into()),
                ..Default::default()
            }),
        }))
    }

    /// A memory snapshot, of a sandbox made with `enable_snapshot`. The fake keeps its files
    /// and its definition, not its memory: a restore starts the entrypoint afresh.
    async fn sandbox_snapshot(&self, r: Request<pb::SandboxSnapshotRequest>) -> R<pb::SandboxSnapshotResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxSnapshot", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        if !x.definition.enable_snapshot {
            return Err(Status::failed_precondition(format!(
                "Sandbox {} was not created with memory snapshots enabled",
                x.id
            )));
        }
        let image_id = self.snapshot(&x).await?;
        let id = modal_id("sn-");
        let mut d = x.definition.clone();
        d.image_id = image_id;
        lock(&self.0.records)
            .memory_snapshots
            .insert(id.clone(), (x.app_id.clone(), d));
        Ok(Response::new(pb::SandboxSnapshotResponse { snapshot_id: id }))
    }

    async fn sandbox_snapshot_wait(
        &self,
        r: Request<pb::SandboxSnapshotWaitRequest>,
    ) -> R<pb::SandboxSnapshotWaitResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxSnapshotWait", None, None, None)?;
        if !lock(&self.0.records).memory_snapshots.contains_key(&q.snapshot_id) {
            return Err(Status::not_found(format!("Snapshot {} not found", q.snapshot_id)));
        }
        // Taken whole by SandboxSnapshot: done.
        Ok(Response::new(pb::SandboxSnapshotWaitResponse {
            result: Some(result(GenericStatus::Success, 0, "")),
        }))
    }

    async fn sandbox_restore(&self, r: Request<pb::SandboxRestoreRequest>) -> R<pb::SandboxRestoreResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxRestore", None, None, None)?;
        let (app_id, definition) = lock(&self.0.records)
            .memory_snapshots
            .get(&q.snapshot_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("Snapshot {} not found", q.snapshot_id)))?;
        let x = self
            .create(pb::SandboxCreateRequest {
                app_id,
                definition: Some(definition),
                ..Default::default()
            })
            .await?;
        Ok(Response::new(pb::SandboxRestoreResponse {
            sandbox_id: x.id.clone(),
        }))
    }

    async fn sandbox_get_tunnels(&self, r: Request<pb::SandboxGetTunnelsRequest>) -> R<pb::SandboxGetTunnelsResponse> {
        let q = r.into_inner();
        self.0.enter("SandboxGetTunnels", Some(&q.sandbox_id), None, None)?;
        let x = self.0.sandbox(&q.sandbox_id)?;
        if x.result().is_some() {
            return Err(Status::failed_precondition(format!(
                "Sandbox {} has already finished",
                x.id
            )));
        }
        // An open-network box shares this machine's network: its port is this machine's.
        let tunnels = x
            .ports
            .iter()
            .map(|&(port, unencrypted)| pb::TunnelData {
                host: "127.0.0.1".into(),
                port,
                unencrypted_host: unencrypted.then(|| "127.0.0.1".into()),
                unencrypted_port: unencrypted.then_some(port),
                container_port: port,
            })
            .collect();
        Ok(Response::new(pb::SandboxGetTunnelsResponse {
            result: Some(result(GenericStatus::Success, 0, "")),
            tunnels,
        }))
    }
}
