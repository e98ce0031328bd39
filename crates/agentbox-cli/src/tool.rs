//! `agentbox tool ID NAME --args JSON`: one tool call on a box, printed as the model reads it.

use agentbox_core::{Ctx, Error, Result, SandboxId};
use agentbox_hands::BoxEnv;
use clap::Args;

#[derive(Args)]
pub(crate) struct ToolArgs {
    /// The box's id.
    id: SandboxId,
    /// The tool: read, write, edit, bash, ls, grep, find, process_read, process_write,
    /// process_kill, process_list.
    name: String,
    /// The tool's arguments as a JSON object.
    #[arg(long, default_value = "{}", value_parser = json_object)]
    args: serde_json::Value,
    /// Print the structured result (content, details, isError) as JSON.
    #[arg(long)]
    json: bool,
    /// Record the call in this run's ledger (see `agentbox ledger`).
    #[arg(long)]
    run: Option<String>,
    /// The ledger the call is recorded in, as `agentbox ledger --store` takes it.
    #[arg(long, requires = "run")]
    store: Option<String>,
}

fn json_object(s: &str) -> std::result::Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// Run the tool; its failure exits 1 with the message the model would read.
pub(crate) async fn run(a: ToolArgs) -> Result<i32> {
    if agentbox_hands::tools::by_name(&a.name).is_none() {
        let names: Vec<&str> = agentbox_hands::tools::all().iter().map(|t| t.name()).collect();
        return Err(Error::invalid(format!(
            "tool {:?}: not a tool ({})",
            a.name,
            names.join(", ")
        )));
    }
    let ctx = Ctx::background();
    let sandbox = crate::boxes::attach(&a.id, &ctx).await?;
    let env = BoxEnv::new(sandbox);
    let result = match &a.run {
        Some(run) => {
            let store = crate::ledger::store(a.store.as_deref()).await?;
            let recorder = agentbox_transport::ledger::Recorder::open(store, run).await?;
            recorder.call(&a.name, &env, a.args, &ctx).await?
        }
        None => agentbox_hands::tools::call(&a.name, &env, a.args, &ctx).await,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| Error::unknown(e.to_string()))?
        );
    } else if result.is_error {
        eprintln!("{}", result.text());
    } else {
        println!("{}", result.text());
    }
    Ok(if result.is_error { 1 } else { 0 })
}
