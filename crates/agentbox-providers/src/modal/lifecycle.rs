//! The lifecycle Modal boxes have beyond create and destroy: relabel, snapshot, snapshots,
//! delete_snapshot, fork (the contract's [`Lifecycle`]; every other operation is refused).

use std::sync::Arc;

use agentbox_core::{
    Ctx, Error, ErrorCode, Labels, Lifecycle, Provider, Result, Sandbox, SandboxId, Snapshot, Spec, check_spec,
    validate_name,
};
use agentbox_modal_proto::client as pb;
use async_trait::async_trait;

use super::api::{CALL_TIMEOUT, call};
use super::{APP_TAG_SNAPSHOT, Kept, ModalProvider, NAME, tags};

#[async_trait]
impl Lifecycle for ModalProvider {
    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        id.expect_provider(NAME)?;
        tags::check_labels(labels)?;
        if let Some(k) = labels
            .keys()
            .find(|k| k.as_str() == tags::MARK || k.starts_with("agentbox."))
        {
            return Err(Error::invalid(format!(
                "labels.{k}: the agentbox namespace is the provider's own"
            )));
        }
        let sandbox_id = id.name();
        let Some(task_id) = self.running_task(sandbox_id, ctx).await? else {
            return Err(Error::gone(format!("relabel: box {id} has ended")));
        };
        let mut t = self.get_tags(sandbox_id, ctx).await?;
        if t.get(tags::MARK).map(String::as_str) != Some("1") {
            return Err(Error::not_found(format!("relabel: box {id} is not one of agentbox's")));
        }
        t.retain(|k, _| k == tags::MARK || k.starts_with("agentbox."));
        t.extend(labels.clone());
        self.set_tags(sandbox_id, &t, ctx).await?;
        self.handle(sandbox_id, task_id, &t, None)?
            .map(|b| Arc::new(b) as Arc<dyn Sandbox>)
            .ok_or_else(|| Error::unknown("modal: the tags just set do not read back"))
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        id.expect_provider(NAME)?;
        validate_name("snapshot", name)?;
        let key = format!("{APP_TAG_SNAPSHOT}{name}");
        if !tags::fits(&key) {
            return Err(Error::invalid(format!(
                "snapshot {name:?}: at most {} bytes on Modal, where it is named in an app tag",
                tags::MAX - APP_TAG_SNAPSHOT.len()
            )));
        }
        if self.snapshot_kept(name, ctx).await?.is_some() {
            return Err(Error::refused(format!("snapshot: there is one named {name:?} already")));
        }
        let kept = if self.o.memory_snapshots {
            self.snapshot_memory(id, ctx).await?
        } else {
            Kept::Files(self.snapshot_fs(id, "snapshot", ctx).await?)
        };
        let now = agentbox_core::now_ms();
        // Named in the app's tags (AppSetTags replaces the whole set: read, add, write).
        let (app_id, mut t) = self.snapshot_tags(ctx).await?;
        if t.contains_key(&key) {
            return Err(Error::refused(format!("snapshot: there is one named {name:?} already")));
        }
        let memory = matches!(kept, Kept::Memory { .. });
        t.insert(key, kept.to_tag());
        self.set_app_tags(&app_id, t, ctx).await?;
        tracing::info!(box_id = %id, snapshot = name, memory, "modal: snapshot taken");
        Ok(Snapshot {
            name: name.to_string(),
            provider: NAME.into(),
            from: Some(id.clone()),
            created_at_ms: Some(now),
            bytes: None,
            memory,
        })
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        let (_, t) = self.snapshot_tags(ctx).await?;
        Ok(t.iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(APP_TAG_SNAPSHOT)?, Kept::parse(v)?)))
            .map(|(name, kept)| Snapshot {
                name: name.to_string(),
                provider: NAME.into(),
                from: None,
                created_at_ms: None,
                bytes: None,
                memory: matches!(kept, Kept::Memory { .. }),
            })
            .collect())
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        let (app_id, mut t) = self.snapshot_tags(ctx).await?;
        let Some(kept) = t.remove(&format!("{APP_TAG_SNAPSHOT}{name}")) else {
            return Ok(false);
        };
        self.set_app_tags(&app_id, t, ctx).await?;
        // A memory snapshot has no call to delete it: its name is gone, the rest is Modal's.
        let Some(Kept::Files(image_id)) = Kept::parse(&kept) else {
            return Ok(true);
        };
        let r = call(ctx, "ImageDelete", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::ImageDeleteRequest {
                image_id: image_id.clone(),
            };
            async move { c.image_delete(req).await }
        })
        .await;
        match r {
            Ok(_) => {}
            Err(e) if e.code() == ErrorCode::NotFound => {}
            // The name is gone; the image is Modal's to expire.
            Err(e) => tracing::warn!(snapshot = name, "modal: deleting the snapshot's image: {e}"),
        }
        Ok(true)
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        agentbox_core::check_fork(n, spec)?;
        check_spec(spec, &self.honours(), NAME)?;
        self.refuse(spec)?;
        let ctx = ctx.with_timeout(self.o.create_timeout);
        // The box's files as they are now, an image each new box starts from.
        let image = self.snapshot_fs(id, "fork", &ctx).await?;
        let made = futures_util::future::join_all((0..n).map(|_| self.make(spec, Some(&image), &ctx))).await;
        let mut boxes = Vec::new();
        let mut first_error = None;
        for m in made {
            match m {
                Ok(b) => boxes.push(b),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            // All or none.
            for b in &boxes {
                let _ = b.destroy(&Ctx::background().with_timeout(CALL_TIMEOUT)).await;
            }
            return Err(Error::new(e.code(), format!("fork: {}", e.message())));
        }
        tracing::info!(box_id = %id, n, image = %image, "modal: forked");
        Ok(boxes.into_iter().map(|b| Arc::new(b) as Arc<dyn Sandbox>).collect())
    }
}
