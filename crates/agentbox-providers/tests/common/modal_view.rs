//! Modal seen from outside the provider: Modal's own API called directly (the generated
//! client of `agentbox-modal-proto`, never the provider's code), shared by the fake's and
//! the live suites.

use agentbox_core::SandboxId;
use agentbox_modal_proto::client as pb;
use agentbox_modal_proto::client::modal_client_client::ModalClientClient;
use agentbox_modal_proto::task_command_router as tcr;
use agentbox_modal_proto::task_command_router::task_command_router_client::TaskCommandRouterClient;
use agentbox_testing::conformance::Outside;
use async_trait::async_trait;
use tonic::Request;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// A Modal client of the test's own.
pub(crate) struct View {
    channel: Channel,
    token_id: String,
    token_secret: String,
}

impl View {
    pub(crate) fn new(server_url: &str, token_id: &str, token_secret: &str) -> Self {
        let mut e = Endpoint::from_shared(server_url.trim_end_matches('/').to_string()).unwrap();
        if server_url.starts_with("https://") {
            e = e.tls_config(ClientTlsConfig::new().with_native_roots()).unwrap();
        }
        View {
            channel: e.connect_lazy(),
            token_id: token_id.into(),
            token_secret: token_secret.into(),
        }
    }

    fn req<T>(&self, m: T) -> Request<T> {
        let mut r = Request::new(m);
        r.metadata_mut()
            .insert("x-modal-token-id", self.token_id.parse().unwrap());
        r.metadata_mut()
            .insert("x-modal-token-secret", self.token_secret.parse().unwrap());
        r.metadata_mut().insert("x-modal-client-type", "1".parse().unwrap());
        r.metadata_mut()
            .insert("x-modal-client-version", "1.6.4".parse().unwrap());
        r
    }

    fn client(&self) -> ModalClientClient<Channel> {
        ModalClientClient::new(self.channel.clone())
    }

    /// The sandbox's result, once it ended.
    pub(crate) async fn result(&self, sandbox_id: &str) -> Option<pb::GenericResult> {
        let w = self
            .client()
            .sandbox_wait(self.req(pb::SandboxWaitRequest {
                sandbox_id: sandbox_id.into(),
                timeout: 0.0,
            }))
            .await;
        match w {
            Ok(w) => w
                .into_inner()
                .result
                .filter(|r| r.status != pb::generic_result::GenericStatus::Unspecified as i32),
            Err(s) if s.code() == tonic::Code::NotFound => Some(pb::GenericResult::default()),
            Err(s) => panic!("SandboxWait: {s}"),
        }
    }

    /// The sandbox's tags.
    #[allow(dead_code)] // Only the fake's suite changes a box's tags behind the provider.
    pub(crate) async fn tags(&self, sandbox_id: &str) -> std::collections::BTreeMap<String, String> {
        let r = self
            .client()
            .sandbox_tags_get(self.req(pb::SandboxTagsGetRequest {
                sandbox_id: sandbox_id.into(),
            }))
            .await
            .unwrap()
            .into_inner();
        r.tags.into_iter().map(|t| (t.tag_name, t.tag_value)).collect()
    }

    /// Replace the sandbox's tags.
    #[allow(dead_code)] // Only the fake's suite changes a box's tags behind the provider.
    pub(crate) async fn set_tags(&self, sandbox_id: &str, tags: &std::collections::BTreeMap<String, String>) {
        self.client()
            .sandbox_tags_set(
                self.req(pb::SandboxTagsSetRequest {
                    sandbox_id: sandbox_id.into(),
                    tags: tags
                        .iter()
                        .map(|(k, v)| pb::SandboxTag {
                            tag_name: k.clone(),
                            tag_value: v.clone(),
                        })
                        .collect(),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
    }

    #[allow(dead_code)] // Only the fake's suite reads a sandbox's listing.
    /// The sandbox as Modal lists it (its timeout, tags…), if it is in `app_id`.
    pub(crate) async fn info(&self, app_id: &str, sandbox_id: &str) -> Option<pb::SandboxInfo> {
        let r = self
            .client()
            .sandbox_list(self.req(pb::SandboxListRequest {
                app_id: app_id.into(),
                include_finished: true,
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        r.sandboxes.into_iter().find(|s| s.id == sandbox_id)
    }

    #[allow(dead_code)] // Only the fake's suite reads a sandbox's listing.
    /// The app's id by name (looked up, never made).
    pub(crate) async fn app_id(&self, name: &str) -> String {
        self.client()
            .app_get_or_create(self.req(pb::AppGetOrCreateRequest {
                app_name: name.into(),
                object_creation_type: pb::ObjectCreationType::Unspecified as i32,
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .app_id
    }

    /// Run `sh -c script` in the sandbox through its command router; its exit code.
    pub(crate) async fn sh(&self, sandbox_id: &str, script: &str, args: &[String]) -> Result<i32, tonic::Status> {
        let task_id = self
            .client()
            .sandbox_get_task_id(self.req(pb::SandboxGetTaskIdRequest {
                sandbox_id: sandbox_id.into(),
                timeout: Some(10.0),
                wait_until_ready: false,
            }))
            .await?
            .into_inner()
            .task_id
            .unwrap_or_default();
        let access = self
            .client()
            .task_get_command_router_access(self.req(pb::TaskGetCommandRouterAccessRequest {
                task_id: task_id.clone(),
            }))
            .await?
            .into_inner();
        let mut e = Endpoint::from_shared(access.url.clone()).unwrap();
        if access.url.starts_with("https://") {
            e = e.tls_config(ClientTlsConfig::new().with_native_roots()).unwrap();
        }
        let mut router = TaskCommandRouterClient::new(e.connect_lazy());
        let bearer: tonic::metadata::AsciiMetadataValue = format!("Bearer {}", access.jwt).parse().unwrap();
        fn with<T>(bearer: &tonic::metadata::AsciiMetadataValue, m: T) -> Request<T> {
            let mut r = Request::new(m);
            r.metadata_mut().insert("authorization", bearer.clone());
            r
        }
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let exec_id = format!(
            "view-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let mut command_args = vec!["sh".to_string(), "-c".into(), script.into(), "view".into()];
        command_args.extend(args.iter().cloned());
        router
            .task_exec_start(with(
                &bearer,
                tcr::TaskExecStartRequest {
                    task_id: task_id.clone(),
                    exec_id: exec_id.clone(),
                    command_args,
                    stdout_config: tcr::TaskExecStdoutConfig::Devnull as i32,
                    stderr_config: tcr::TaskExecStderrConfig::Devnull as i32,
                    ..Default::default()
                },
            ))
            .await
            .unwrap();
        router
            .task_exec_stdin_write(with(
                &bearer,
                tcr::TaskExecStdinWriteRequest {
                    task_id: task_id.clone(),
                    exec_id: exec_id.clone(),
                    offset: 0,
                    data: vec![],
                    eof: true,
                },
            ))
            .await
            .unwrap();
        let w = router
            .task_exec_wait(with(&bearer, tcr::TaskExecWaitRequest { task_id, exec_id }))
            .await?
            .into_inner();
        Ok(match w.exit_status {
            Some(tcr::task_exec_wait_response::ExitStatus::Code(c)) => c,
            Some(tcr::task_exec_wait_response::ExitStatus::Signal(s)) => 128 + s,
            None => panic!("TaskExecWait answered no exit"),
        })
    }
}

/// Whether any of `pids` runs and is not a zombie: exits 0 when one does.
const ANY_ALIVE: &str = r#"for p; do
  st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
  [ -n "$st" ] && [ "$st" != Z ] && exit 0
done
exit 1"#;

#[async_trait]
impl Outside for View {
    async fn ended(&self, id: &SandboxId) -> bool {
        self.result(id.name()).await.is_some()
    }

    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        if self.ended(id).await {
            return false;
        }
        let args: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
        // A sandbox that ended under the question runs nothing.
        self.sh(id.name(), ANY_ALIVE, &args).await.is_ok_and(|c| c == 0)
    }
}
