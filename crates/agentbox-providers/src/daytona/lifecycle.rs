//! The lifecycle Daytona boxes have beyond create and destroy: open, discard, sleep, wake, extend,
//! relabel (the contract's [`Lifecycle`]; every other operation is refused).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, Labels, Lifecycle, Provider, Result, Sandbox, SandboxId, Spec, check_deadline, now_ms, validate_name,
};
use async_trait::async_trait;

use super::{DaytonaProvider, LABEL_NAME, Made, Runner, delete_sandbox, get_sandbox, put_labels, sandbox};

#[async_trait]
impl Lifecycle for DaytonaProvider {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        validate_name("name", name)?;
        self.check(spec)?;
        let key = crate::lifecycle::name_key(name, &spec.labels)?;
        let sandbox_name = format!("agentbox-n-{key}");
        for _ in 0..4 {
            if let Some(d) = get_sandbox(&self.api, &sandbox_name, ctx).await? {
                if sandbox::status_of(&d) == agentbox_core::Status::Ended {
                    // An ended box (failed, being deleted) still holds the name: end it and
                    // make the name's box anew.
                    delete_sandbox(&self.api, &d.id, ctx).await?;
                    self.await_name_free(&sandbox_name, ctx).await?;
                    continue;
                }
                let d = match d.state() {
                    "creating" | "starting" | "pending_build" | "building_snapshot" | "pulling_snapshot"
                    | "restoring" => match self.wait_started(d, ctx).await {
                        Ok(d) => d,
                        // Another host's make that failed: its maker deletes it.
                        Err(e) if ctx.check().is_ok() => {
                            tracing::info!(error = %e, "another host's make of this name failed");
                            continue;
                        }
                        Err(e) => return Err(e),
                    },
                    _ => d,
                };
                // Another host's make of this name: its box once it is whole.
                let Some(d) = self.await_ready(d, ctx).await? else {
                    continue;
                };
                let have = d.labels();
                let host: Labels = have
                    .iter()
                    .filter(|(k, _)| !agentbox_core::is_reserved_label(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if have.get(LABEL_NAME).map(String::as_str) != Some(name) || host != spec.labels {
                    return Err(Error::refused(format!(
                        "open {name:?}: sandbox {sandbox_name} exists with other labels"
                    )));
                }
                if sandbox::status_of(&d) == agentbox_core::Status::Sleeping {
                    return self.wake(&self.id_of(&d.id)?, ctx).await;
                }
                if let Some(b) = self.sandbox_of(&d, Runner::Checked, ctx).await? {
                    return Ok(b);
                }
                continue;
            }
            match self.make(&sandbox_name, &key, Some(name), spec, ctx).await {
                Ok(b) => return Ok(b),
                // Another host made it first: that one is the box, once it runs.
                Err(Made::Exists) => {
                    // Daytona may answer the name 404 for a while after another's create (its
                    // lookup by name is cached): asked for up to 15 s.
                    for _ in 0..75 {
                        if get_sandbox(&self.api, &sandbox_name, ctx).await?.is_some() {
                            break;
                        }
                        ctx.run(tokio::time::sleep(Duration::from_millis(200))).await?;
                    }
                    continue;
                }
                Err(Made::Failed(e)) => return Err(e),
            }
        }
        Err(Error::unknown(format!(
            "open {name:?}: sandbox {sandbox_name} kept ending or changing while it was opened"
        )))
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let key = crate::lifecycle::name_key(name, labels)?;
        let sandbox_name = format!("agentbox-n-{key}");
        match get_sandbox(&self.api, &sandbox_name, ctx).await? {
            Some(d) => {
                delete_sandbox(&self.api, &d.id, ctx).await?;
                Ok(sandbox::status_of(&d) != agentbox_core::Status::Ended)
            }
            None => Ok(false),
        }
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let d = self.live(id, ctx).await?;
        if sandbox::status_of(&d) == agentbox_core::Status::Sleeping {
            // Asleep once its programs have ended, not while it stops.
            self.await_state(&d.id, &["stopped", "archived"], ctx).await?;
            return Ok(());
        }
        let url = self.api.url(&format!("/sandbox/{}/stop", d.id));
        self.api
            .ok(ctx, "stopping the sandbox", |c| {
                c.post(&url).query(&[("force", "false")])
            })
            .await?;
        self.await_state(&d.id, &["stopped", "archived"], ctx).await?;
        tracing::info!(box_id = %id, "asleep");
        Ok(())
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let mut d = self.live(id, ctx).await?;
        if matches!(d.state(), "stopping" | "archiving") {
            // A start is refused while it stops: its end first.
            d = self.await_state(&d.id, &["stopped", "archived"], ctx).await?;
        }
        if !matches!(d.state(), "started" | "starting" | "restoring") {
            let url = self.api.url(&format!("/sandbox/{}/start", d.id));
            self.api.ok(ctx, "starting the sandbox", |c| c.post(&url)).await?;
        }
        let d = self.await_state(&d.id, &["started"], ctx).await?;
        tracing::info!(box_id = %id, "awake");
        self.sandbox_of(&d, Runner::Checked, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended as it woke")))
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_deadline(ends_at_ms, now_ms())?;
        let d = self.live(id, ctx).await?;
        // A time to live set later counts from the moment it is set, in Daytona's minutes.
        let minutes = self.minutes(ends_at_ms.saturating_sub(now_ms()));
        let url = self.api.url(&format!("/sandbox/{}/ttl/{minutes}", d.id));
        self.api
            .ok(ctx, "setting the sandbox's time to live", |c| c.post(&url))
            .await?;
        tracing::info!(box_id = %id, ends_at_ms, minutes, "extended");
        let b = self
            .attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended as it was extended")))?;
        match b.facts().ends_at_ms {
            // A few seconds' grace for clocks that differ between here and Daytona.
            Some(end) if end + 5_000 >= ends_at_ms => Ok(b),
            other => Err(Error::unknown(format!(
                "extend {id}: Daytona took a time to live of {minutes} minutes but reads back an end of {other:?} ms, \
                 not at least {ends_at_ms}"
            ))),
        }
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        agentbox_core::validate_labels(labels)?;
        let d = self.live(id, ctx).await?;
        let mut all: BTreeMap<String, String> = d
            .labels()
            .into_iter()
            .filter(|(k, _)| agentbox_core::is_reserved_label(k))
            .collect();
        all.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        put_labels(&self.api, &d.id, &all, ctx).await?;
        // A list right after answers by the new labels, as after a create.
        let removed: Vec<String> = d.labels().into_keys().filter(|k| !all.contains_key(k)).collect();
        self.await_index(&d.id, &all, &removed, ctx).await?;
        self.attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended as it was relabelled")))
    }
}
