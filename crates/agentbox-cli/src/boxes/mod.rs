//! `agentbox box …`: the contract, one subcommand per call. The command line's shape is in
//! `args`, the choice of a provider in `provider`, `box exec` and `box shell` in `exec`; this
//! file runs the other subcommands.

mod args;
mod exec;
mod provider;

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Labels, Network, Provider, Result, Sandbox, SandboxId, Spec};
use agentbox_providers::registry::{self, Options};

use crate::{procs, term};
use args::{CreateArgs, mount};

pub(crate) use args::{BoxCommand, default_help};
pub(crate) use provider::{attach, chosen, entry, environment, provider, provider_with};

pub(crate) async fn run(cmd: BoxCommand) -> Result<i32> {
    let ctx = Ctx::background();
    match cmd {
        BoxCommand::Create(a) => {
            let json = a.json;
            let (spec, provider) = spec_and_provider(*a).await?;
            let b = provider.create(&spec, &ctx).await?;
            tracing::info!(box_id = %b.id(), runner = ?b.facts().runner, "box made");
            print_box(&*b, json);
            Ok(0)
        }
        BoxCommand::Open { name, replace, create } => {
            let json = create.json;
            let (spec, provider) = spec_and_provider(*create).await?;
            let b = agentbox_providers::lifecycle::open_as_asked(&*provider, &name, &spec, replace, &ctx).await?;
            tracing::info!(box_id = %b.id(), name, "box opened");
            print_box(&*b, json);
            Ok(0)
        }
        BoxCommand::Discard { name, provider, labels } => {
            let env = environment()?;
            let p = chosen(provider.as_deref(), &env)
                .await?
                .make(&Options::default(), &env)
                .await?;
            let labels: Labels = labels.into_iter().collect();
            let discarded = p.discard(&name, &labels, &ctx).await?;
            agentbox_providers::lifecycle::forget_opened(p.name(), &name, &labels)?;
            if discarded {
                println!("{name}");
                Ok(0)
            } else {
                eprintln!(
                    "agentbox: box discard: no {} box is named {name:?} with those labels",
                    p.name()
                );
                Ok(1)
            }
        }
        BoxCommand::Sleep { id } => {
            provider(id.provider()).await?.sleep(&id, &ctx).await?;
            println!("{id}");
            Ok(0)
        }
        BoxCommand::Wake { id } => {
            let b = provider(id.provider()).await?.wake(&id, &ctx).await?;
            println!("{}", b.id());
            Ok(0)
        }
        BoxCommand::Extend { id, by, within, json } => {
            let p = provider(id.provider()).await?;
            let now = agentbox_core::now_ms();
            let to = match (by, within) {
                (Some(by), _) => {
                    let b = p
                        .attach(&id, &ctx)
                        .await?
                        .ok_or_else(|| Error::not_found(format!("box {id}: no such box, or it has ended")))?;
                    let from = b
                        .facts()
                        .ends_at_ms
                        .ok_or_else(|| Error::unsupported(format!("box {id}: its facts state no deadline to move")))?;
                    from.saturating_add(by.as_millis() as u64)
                }
                (None, Some(d)) => now.saturating_add(d.as_millis() as u64),
                (None, None) => return Err(Error::invalid("extend: give --by or --in")),
            };
            let b = p.extend(&id, to, &ctx).await?;
            let ends = b.facts().ends_at_ms.unwrap_or(to);
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "id": b.id(), "ends_at": agentbox_core::rfc3339(ends as i64), "ends_at_ms": ends })
                );
            } else {
                println!("{}", agentbox_core::rfc3339(ends as i64));
            }
            Ok(0)
        }
        BoxCommand::Snapshot { id, name } => {
            let snap = provider(id.provider()).await?.snapshot(&id, &name, &ctx).await?;
            println!("{}", snap.name);
            Ok(0)
        }
        BoxCommand::Snapshots {
            provider: p,
            delete,
            json,
        } => {
            let env = environment()?;
            let p = chosen(p.as_deref(), &env)
                .await?
                .make(&Options::default(), &env)
                .await?;
            if let Some(name) = delete {
                if p.delete_snapshot(&name, &ctx).await? {
                    println!("{name}");
                    return Ok(0);
                }
                eprintln!(
                    "agentbox: box snapshots --delete: {} has no snapshot {name:?}",
                    p.name()
                );
                return Ok(1);
            }
            let snaps = p.snapshots(&ctx).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&snaps).map_err(|e| Error::unknown(e.to_string()))?
                );
            } else {
                for s in snaps {
                    let from = s.from.as_ref().map(|f| f.to_string()).unwrap_or_else(|| "-".into());
                    let at = s
                        .created_at_ms
                        .map(|t| agentbox_core::rfc3339(t as i64))
                        .unwrap_or_else(|| "-".into());
                    println!("{}\t{from}\t{at}", s.name);
                }
            }
            Ok(0)
        }
        BoxCommand::Fork {
            id,
            n,
            lifetime,
            labels,
            json,
        } => {
            let mut spec = Spec::new(lifetime);
            spec.labels = labels.into_iter().collect();
            let forks = provider(id.provider()).await?.fork(&id, n, &spec, &ctx).await?;
            if json {
                let rows: Vec<_> = forks
                    .iter()
                    .map(|b| serde_json::json!({ "id": b.id(), "facts": b.facts() }))
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                for b in forks {
                    println!("{}", b.id());
                }
            }
            Ok(0)
        }
        BoxCommand::Exec(a) => exec::exec(*a).await,
        BoxCommand::Shell { id, cwd } => exec::shell(&id, cwd).await,
        BoxCommand::Ps { id, all, json } => procs::ps(&*attach(&id, &ctx).await?, &id, all, json).await,
        BoxCommand::Kill { id, handle, signal } => procs::kill(&*attach(&id, &ctx).await?, &id, handle, signal).await,
        BoxCommand::Logs {
            id,
            handle,
            follow,
            after,
        } => procs::logs(&*attach(&id, &ctx).await?, &id, handle, after, follow).await,
        BoxCommand::Attach {
            id,
            handle,
            after,
            no_stdin,
        } => procs::attach(&*attach(&id, &ctx).await?, &id, handle, after, no_stdin).await,
        BoxCommand::Ls {
            provider: p,
            labels,
            json,
        } => {
            let labels: Labels = labels.into_iter().collect();
            let boxes = match p {
                Some(p) => provider(&p).await?.list(&labels, &ctx).await?,
                None => list_everywhere(&labels).await,
            };
            let mut rows = Vec::with_capacity(boxes.len());
            for b in &boxes {
                rows.push((b, state_of(&**b).await));
            }
            if json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|(b, state)| {
                        let mut row = serde_json::json!({
                            "id": b.id(),
                            "state": state.word(),
                            "labels": b.labels(),
                            "facts": b.facts(),
                        });
                        if let State::Unknown(why) = state {
                            row["why"] = why.clone().into();
                        }
                        row
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
                return Ok(0);
            }
            let now = agentbox_core::now_ms();
            let width = rows
                .iter()
                .map(|(b, _)| b.id().as_str().len())
                .max()
                .unwrap_or(0)
                .max(2);
            println!("{:<width$}  {:<10} {:<9} LABELS", "ID", "STATE", "LEFT");
            for (b, state) in &rows {
                let left = b
                    .facts()
                    .ends_at_ms
                    .map(|e| duration(e.saturating_sub(now)))
                    .unwrap_or_else(|| "-".into());
                let labels: Vec<String> = b.labels().iter().map(|(k, v)| format!("{k}={v}")).collect();
                let labels = if labels.is_empty() {
                    "-".to_string()
                } else {
                    labels.join(",")
                };
                println!("{:<width$}  {:<10} {left:<9} {labels}", b.id().as_str(), state.word());
            }
            for (_, state) in &rows {
                if let State::Unknown(why) = state {
                    term::say(&format!("box ls: {why}"));
                }
            }
            Ok(0)
        }
        BoxCommand::Facts { id } => {
            let b = attach(&id, &ctx).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(b.facts()).map_err(|e| Error::unknown(e.to_string()))?
            );
            Ok(0)
        }
        BoxCommand::Endpoint { id, port, json } => {
            let e = attach(&id, &ctx).await?.endpoint(port, &ctx).await?;
            if json {
                println!("{}", serde_json::json!(e));
                return Ok(0);
            }
            match &e.url {
                Some(url) => println!("{url}"),
                None => println!("{}:{}", e.host, e.port),
            }
            Ok(0)
        }
        BoxCommand::Probe { id, dir, json } => {
            let b = attach(&id, &ctx).await?;
            let probe = agentbox_providers::durability::probe_acknowledged_writes(&*b, dir.as_deref(), &ctx).await?;
            tracing::info!(box_id = %id, %probe, "acknowledged writes probed");
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&probe).map_err(|e| Error::unknown(e.to_string()))?
                );
            } else {
                println!("box {id}: {probe}");
            }
            Ok(if probe.passed() { 0 } else { 1 })
        }
        BoxCommand::Net { id, last, json } => {
            let b = attach(&id, &ctx).await?;
            let refusals = b.net_refusals(last, &ctx).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&refusals).map_err(|e| Error::unknown(e.to_string()))?
                );
                return Ok(0);
            }
            if refusals.is_empty() {
                eprintln!("box {id}: nothing refused");
            }
            for r in &refusals {
                let address = r.address.as_deref().map(|a| format!(" ({a})")).unwrap_or_default();
                println!(
                    "{}  {}:{}{address}  {}: {}",
                    agentbox_core::rfc3339(i64::try_from(r.at_ms).unwrap_or(i64::MAX)),
                    r.host,
                    r.port,
                    r.rule,
                    r.why
                );
            }
            Ok(0)
        }
        BoxCommand::Rm { ids } => {
            for id in ids {
                attach(&id, &ctx).await?.destroy(&ctx).await?;
                tracing::info!(box_id = %id, "box ended");
                println!("{id}");
            }
            Ok(0)
        }
        BoxCommand::Cp { src, dst } => crate::cp::copy(&src, &dst, &ctx).await.map(|_| 0),
    }
}

/// The spec and the provider `create` (and `open`) flags ask for; a provider option the
/// chosen provider does not take is refused (by the registry), naming the flag.
async fn spec_and_provider(a: CreateArgs) -> Result<(Spec, Arc<dyn Provider>)> {
    let mut spec = Spec::new(a.lifetime);
    spec.labels = a.labels.into_iter().collect();
    spec.env = a.env.into_iter().collect();
    spec.image = a.image;
    spec.snapshot = a.from_snapshot;
    spec.cpus = a.cpus;
    spec.memory_mb = a.memory;
    spec.isolation = a.isolation;
    spec.network = match a.network.as_deref() {
        None => None,
        Some("open") => Some(Network::Open),
        Some("none") => Some(Network::None),
        // The namespace provider warns once the box is made (a refused one needs no warning).
        Some("host") => Some(Network::Host),
        Some(other) => {
            return Err(crate::usage(Error::invalid(format!(
                "--network: {other:?} is not open, none or host"
            ))));
        }
    };
    if !a.allow.is_empty() {
        // Each entry is checked here too, so the flag is named in what is wrong.
        agentbox_core::Allowlist::parse(&a.allow).map_err(|e| {
            crate::usage(Error::invalid(format!(
                "--allow: {}",
                e.message().trim_start_matches("spec.network.allow: ")
            )))
        })?;
        spec.network = Some(Network::Allow(a.allow));
    }
    for m in &a.mounts {
        spec.mounts.push(mount(m)?);
    }
    for s in &a.secrets {
        spec.secrets
            .push(agentbox_core::SecretSpec::parse_flag(s).map_err(crate::usage)?);
    }
    spec.ports = a.ports;
    let env = environment()?;
    let entry = chosen(a.provider.as_deref(), &env).await?;
    let options = Options {
        runner: !a.no_runner,
        user: a.user.clone(),
        pids_limit: a.pids_limit,
        keep_capabilities: a.keep_capabilities,
        disk_bytes: a.disk,
    };
    // The registry refuses a flag the provider does not take, naming it.
    Ok((spec, entry.make(&options, &env).await?))
}

/// Print a box's id, or with `json` its id and facts.
fn print_box(b: &dyn Sandbox, json: bool) {
    if json {
        println!("{}", serde_json::json!({ "id": b.id(), "facts": b.facts() }));
    } else {
        println!("{}", b.id());
    }
}

/// The boxes of every provider this build has, within a deadline each; the providers that
/// cannot be made or cannot list (no Docker engine) are left out, named in one line on stderr,
/// each one's reason logged (`-v` shows them).
async fn list_everywhere(labels: &Labels) -> Vec<Arc<dyn Sandbox>> {
    let mut all = Vec::new();
    let mut left_out = Vec::new();
    for name in registry::names() {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
        let listed = match provider(name).await {
            Ok(p) => p.list(labels, &ctx).await,
            Err(e) => Err(e),
        };
        match listed {
            Ok(boxes) => all.extend(boxes),
            Err(e) => {
                tracing::info!(provider = name, reason = %crate::one_line(e.message()), "box ls: provider left out");
                left_out.push(name);
            }
        }
    }
    if !left_out.is_empty() {
        term::say(&format!(
            "box ls: left out {} boxes: they could not be listed here (-v says why; --provider NAME to see one fail)",
            left_out.join(", ")
        ));
    }
    all
}

/// A listed box's state, as `box ls` prints it.
enum State {
    Running,
    Asleep,
    Ended,
    /// Its status could not be read: why.
    Unknown(String),
}

impl State {
    fn word(&self) -> &'static str {
        match self {
            State::Running => "running",
            State::Asleep => "asleep",
            State::Ended => "ended",
            State::Unknown(_) => "unknown",
        }
    }
}

/// The state of `b`, asked of its box within 10 s.
async fn state_of(b: &dyn Sandbox) -> State {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
    match b.status(&ctx).await {
        Ok(agentbox_core::Status::Running) => State::Running,
        Ok(agentbox_core::Status::Sleeping) => State::Asleep,
        Ok(agentbox_core::Status::Ended) => State::Ended,
        Err(e) => State::Unknown(crate::one_line(e.message())),
    }
}

/// A duration as a person reads it: `42s`, `9m12s`, `3h05m`, `2d04h`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Split `ID:PATH`, when `s` starts with a box id.
pub(crate) fn box_path(s: &str) -> Option<(SandboxId, String)> {
    let (provider, rest) = s.split_once(':')?;
    let (name, path) = rest.split_once(':')?;
    let id = SandboxId::new(provider, name).ok()?;
    Some((id, path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_paths_parse() {
        let (id, p) = box_path("local:ab12:dir/f.txt").unwrap();
        assert_eq!((id.as_str(), p.as_str()), ("local:ab12", "dir/f.txt"));
        assert!(box_path("./file.txt").is_none());
        assert!(box_path("/abs/x").is_none());
    }

    #[test]
    fn durations_read_as_a_person_reads_them() {
        assert_eq!(duration(999), "0s");
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(552_000), "9m12s");
        assert_eq!(duration(3_600_000 + 5 * 60_000 + 59_000), "1h05m");
        assert_eq!(duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }
}
