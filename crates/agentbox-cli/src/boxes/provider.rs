//! Which provider a command's boxes come from: `--provider`, `$AGENTBOX_PROVIDER`, or the
//! default (namespace boxes where they work, else local ones), made from this process's
//! environment with this executable as the boxes' helper.

use std::sync::Arc;

use agentbox_core::{Ctx, Error, Provider, Result, Sandbox, SandboxId};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::registry::{self, Entry, Environment, Options};

/// The variable naming the provider of a command that names none (`box create`, `mcp`,
/// `bench`): a machine where namespace boxes cannot work sets it to `local` (or `docker`) once
/// rather than passing `--provider` to every command, and hears no warning.
pub(crate) const PROVIDER_ENV: &str = "AGENTBOX_PROVIDER";

/// The provider of a command that names none, and, when it is `local` only because namespace
/// boxes do not work here, why not (the probe's answer, for the caller to say).
///
/// `$AGENTBOX_PROVIDER` when set (a choice the user made: no probe, no fallback); else
/// `namespace` where its boxes work on this machine, since an agent's commands should be
/// isolated unless the user asks for less; else `local`, which isolates nothing. Whether they
/// work is the provider's own probe ([`agentbox_providers::namespace::available`]: one short
/// process of the runner that `env` finds) after the registry says this build has them.
pub(crate) async fn default_provider(env: &Environment) -> Result<(&'static Entry, Option<String>)> {
    if let Some(name) = env.var(PROVIDER_ENV).filter(|v| !v.is_empty()) {
        let name = name
            .to_str()
            .ok_or_else(|| Error::invalid(format!("{PROVIDER_ENV}: {name:?} is not UTF-8")))?;
        return Ok((entry(name, PROVIDER_ENV)?, None));
    }
    match namespace_works(env).await {
        Ok(namespace) => Ok((namespace, None)),
        Err(e) => Ok((
            entry("local", "the default provider")?,
            Some(crate::one_line(e.message())),
        )),
    }
}

/// The registry's namespace entry, where its boxes work on this machine.
async fn namespace_works(env: &Environment) -> Result<&'static Entry> {
    let namespace = registry::find("namespace")?;
    // The registry has no namespace entry compiled in off Linux, so this is Linux's alone.
    #[cfg(target_os = "linux")]
    agentbox_providers::namespace::available(&env.runner()?).await?;
    #[cfg(not(target_os = "linux"))]
    let _ = env;
    Ok(namespace)
}

/// The registry's entry for `--provider NAME`, or without one the default
/// ([`default_provider`]), saying once on stderr why it is `local` when namespace boxes do not
/// work. A named provider is never probed.
pub(crate) async fn chosen(flag: Option<&str>, env: &Environment) -> Result<&'static Entry> {
    if let Some(name) = flag {
        return entry(name, "--provider");
    }
    let (chosen, why_not) = default_provider(env).await?;
    if let Some(why) = why_not {
        eprintln!(
            "agentbox: namespace boxes cannot be made here: {why}; using a local box, which isolates nothing \
             (--provider local or {PROVIDER_ENV}=local chooses it without this line)"
        );
    }
    Ok(chosen)
}

/// What providers are made from: this process's variables, and this executable as the boxes'
/// helper (`agentbox runner …`: local boxes' supervisor, and the runner of a Docker box where no
/// `agentbox-runner` is found), so an installed `agentbox` needs no second file.
pub(crate) fn environment() -> Result<Environment> {
    let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
    Ok(Environment::from_process().with_program(HelperCommand::new(exe, vec!["runner".into()])))
}

/// The registry's entry for `name`, an unknown one's error naming `flag` and every provider
/// (a usage error where `flag` is one: `--provider`).
pub(crate) fn entry(name: &str, flag: &str) -> Result<&'static Entry> {
    registry::find(name).map_err(|e| {
        let e = e.context(flag);
        if flag.starts_with("--") { crate::usage(e) } else { e }
    })
}

/// The provider called `name`, on its defaults (a runner in each box where it can start one):
/// how boxes are found by id, listed and measured.
pub(crate) async fn provider(name: &str) -> Result<Arc<dyn Provider>> {
    provider_with(name, &Options::default()).await
}

/// The provider called `name`, made by the registry with `options`.
pub(crate) async fn provider_with(name: &str, options: &Options) -> Result<Arc<dyn Provider>> {
    entry(name, "--provider")?.make(options, &environment()?).await
}

pub(crate) async fn attach(id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
    entry(id.provider(), &format!("box {id}"))?
        .make(&Options::default(), &environment()?)
        .await?
        .attach(id, ctx)
        .await?
        .ok_or_else(|| Error::not_found(format!("box {id}: no such box, or it has ended")))
}
