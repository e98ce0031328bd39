//! One sandbox's toolbox (the daemon in the sandbox, reached through Daytona's proxy at
//! `{toolboxProxyUrl}/{sandboxId}`): a program run to its end, session commands started
//! and left running, files in and out.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use serde::Deserialize;
use serde_json::json;

use super::api::{Api, decode, read_capped, status_error};

/// The SDK version the daemon answers logs as JSON to.
const LOGS_AS_JSON: &str = "0.226.1";

/// A sandbox's toolbox.
#[derive(Clone)]
pub(crate) struct Toolbox {
    api: Api,
    /// `{toolboxProxyUrl}/{sandboxId}`.
    base: String,
    /// Daytona's id of the sandbox.
    sandbox: String,
}

/// What `process/execute` answers: the exit and the output (stdout and stderr as one).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Executed {
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The SDK's older name for the exit.
    #[serde(default)]
    pub code: Option<i32>,
    #[serde(default)]
    pub result: String,
}

impl Executed {
    pub(crate) fn exit(&self) -> i32 {
        self.exit_code.or(self.code).unwrap_or(-1)
    }
}

impl Toolbox {
    pub(crate) fn new(api: Api, proxy_url: &str, sandbox_id: &str) -> Self {
        Toolbox {
            api,
            base: format!("{}/{sandbox_id}", proxy_url.trim_end_matches('/')),
            sandbox: sandbox_id.to_string(),
        }
    }

    /// Where the control plane says the sandbox ended (`gone`) or sleeps (`refused`): the error
    /// a program's wait should answer in place of the toolbox's; `None` where it runs, or the
    /// control plane does not answer either.
    pub(crate) async fn ended_or_asleep(&self) -> Option<Error> {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(15));
        match super::get_sandbox(&self.api, &self.sandbox, &ctx).await {
            Ok(None) => Some(Error::gone(format!("sandbox {}: it has ended", self.sandbox))),
            Ok(Some(d)) => match super::sandbox::status_of(&d) {
                agentbox_core::Status::Ended => Some(Error::gone(format!("sandbox {}: it has ended", self.sandbox))),
                agentbox_core::Status::Sleeping => Some(Error::refused(format!(
                    "sandbox {}: it was put to sleep, which ended its programs",
                    self.sandbox
                ))),
                agentbox_core::Status::Running => None,
            },
            Err(_) => None,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Run `command` (a shell's text) to its end in `cwd`, at most `secs` seconds (the
    /// toolbox then kills it and answers 408, which is `timeout` here).
    pub(crate) async fn execute(&self, ctx: &Ctx, what: &str, command: &str, secs: u64) -> Result<Executed> {
        // The daemon hands the text to the first of zsh, bash and sh, and zsh reads the
        // user's ~/.zshenv: every script is sh's, whatever the image's shells.
        let command = format!("sh -c {}", super::exec::sq(command));
        let body = json!({"command": command, "timeout": secs});
        let url = self.url("/process/execute");
        // The call lasts as long as a call may, and at least as long as the program may and a
        // little more, so the toolbox's own 408 comes first.
        let deadline = self.api.request_timeout().max(Duration::from_secs(secs + 5));
        let r = self
            .api
            .send_with(ctx, what, deadline, true, |c| c.post(&url).json(&body))
            .await?;
        decode(r, what).await
    }

    /// Make the session `sid` (one shell, whose commands run in turn).
    pub(crate) async fn create_session(&self, ctx: &Ctx, sid: &str) -> Result<()> {
        let url = self.url("/process/session");
        let body = json!({"sessionId": sid});
        self.api
            .ok(ctx, "making a toolbox session", |c| c.post(&url).json(&body))
            .await
    }

    /// Start `command` in session `sid` and leave it running: its command id.
    pub(crate) async fn start_command(&self, ctx: &Ctx, sid: &str, command: &str) -> Result<String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Started {
            cmd_id: String,
        }
        let url = self.url(&format!("/process/session/{sid}/exec"));
        let body = json!({"command": command, "runAsync": true, "suppressInputEcho": true});
        // Not sent again on a 503: the command may have started.
        let what = "starting a session command";
        let r = self
            .api
            .send_with(ctx, what, self.api.request_timeout(), false, |c| {
                c.post(&url).json(&body)
            })
            .await?;
        let s: Started = decode(r, what).await?;
        Ok(s.cmd_id)
    }

    /// Write `data` (a line: the toolbox adds its newline) to the stdin of command `cmd` of
    /// session `sid`: a pipe, never a file of the box.
    pub(crate) async fn send_input(&self, ctx: &Ctx, sid: &str, cmd: &str, data: &str) -> Result<()> {
        let url = self.url(&format!("/process/session/{sid}/command/{cmd}/input"));
        let body = json!({ "data": data });
        self.api
            .ok(ctx, "writing a session command's input", |c| c.post(&url).json(&body))
            .await
    }

    /// The exit of command `cmd` of session `sid`, once it has one.
    pub(crate) async fn command_exit(&self, ctx: &Ctx, sid: &str, cmd: &str) -> Result<Option<i32>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Command {
            #[serde(default)]
            exit_code: Option<i32>,
        }
        let url = self.url(&format!("/process/session/{sid}/command/{cmd}"));
        let c: Command = self.api.json(ctx, "reading a session command", |c| c.get(&url)).await?;
        Ok(c.exit_code)
    }

    /// What command `cmd` of session `sid` wrote on stdout and stderr. The daemon answers them
    /// apart, as JSON, only to a client that says it is an SDK of 0.167 or later.
    pub(crate) async fn command_logs(&self, ctx: &Ctx, sid: &str, cmd: &str) -> Result<(String, String)> {
        #[derive(Deserialize)]
        struct Logs {
            #[serde(default)]
            stdout: String,
            #[serde(default)]
            stderr: String,
        }
        let url = self.url(&format!("/process/session/{sid}/command/{cmd}/logs"));
        let l: Logs = self
            .api
            .json(ctx, "reading a session command's output", |c| {
                c.get(&url).header("X-Daytona-SDK-Version", LOGS_AS_JSON)
            })
            .await?;
        Ok((l.stdout, l.stderr))
    }

    /// End session `sid` and whatever of it still runs; absent already is done.
    pub(crate) async fn delete_session(&self, ctx: &Ctx, sid: &str) -> Result<()> {
        let url = self.url(&format!("/process/session/{sid}"));
        match self.api.ok(ctx, "ending a toolbox session", |c| c.delete(&url)).await {
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            r => r,
        }
    }

    /// Write files (absolute paths) in one request; the toolbox makes their parents.
    pub(crate) async fn upload(&self, ctx: &Ctx, what: &str, files: &[(String, &[u8])]) -> Result<()> {
        let url = self.url("/files/bulk-upload");
        let total: usize = files.iter().map(|(_, d)| d.len()).sum();
        // A large file moves at a few MiB/s at worst: the deadline grows with it.
        let deadline = self.api.request_timeout() + Duration::from_secs((total >> 20) as u64);
        let r = self
            .api
            .send_with(ctx, what, deadline, true, |c| {
                let mut form = reqwest::multipart::Form::new();
                for (i, (path, data)) in files.iter().enumerate() {
                    form = form.text(format!("files[{i}].path"), path.clone()).part(
                        format!("files[{i}].file"),
                        reqwest::multipart::Part::bytes(data.to_vec()).file_name(path.clone()),
                    );
                }
                c.post(&url).multipart(form)
            })
            .await?;
        let status = r.status().as_u16();
        let body = read_capped(r, 1 << 20, what).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(status_error(status, &body, what))
        }
    }

    /// Read the file at `path` (absolute) whole, refused `too_large` past `max_bytes`.
    pub(crate) async fn download(&self, ctx: &Ctx, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let what = format!("reading {path} in the sandbox");
        let url = self.url("/files/download");
        let r = self
            .api
            .send(ctx, &what, |c| c.get(&url).query(&[("path", path)]))
            .await?;
        let status = r.status().as_u16();
        if !(200..300).contains(&status) {
            let body = read_capped(r, 1 << 20, &what).await?;
            let e = status_error(status, &body, &what);
            // The daemon answers a missing file 404, or 400 naming it.
            let text = e.message().to_ascii_lowercase();
            if e.code() == ErrorCode::NotFound || text.contains("no such file") || text.contains("not found") {
                return Err(Error::not_found(format!("{path}: no such file in the box")));
            }
            if text.contains("directory") {
                return Err(Error::invalid(format!("{path}: is a directory")));
            }
            return Err(e);
        }
        let cap = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        read_capped(r, cap, &what).await.map_err(|e| {
            if e.code() == ErrorCode::TooLarge {
                Error::too_large(format!("{path}: over the {max_bytes}-byte bound"))
            } else {
                e
            }
        })
    }
}
