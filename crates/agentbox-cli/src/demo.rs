//! `agentbox demo`: the seed's pick-up-a-run on local defaults, with no key. One run
//! directory; three processes one after another, each opening the run (the next
//! generation), answering one question of the same chat with a scripted model whose tool call
//! runs in a local box, and releasing it. The last still knows the first question.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentbox_core::{Ctx, Error, Result};
use agentbox_runs::agent::{self, Reply, ScriptedModel, text_of};
use agentbox_runs::{Runs, read_status};
use agentbox_transport::ledger::{Recorder, SqliteLedger};
use agentbox_transport::{Transport, TransportConfig, TransportHost};
use serde_json::json;

/// The questions, one a generation.
const QUESTIONS: [&str; 3] = [
    "What is the box's machine called?",
    "Keep a note of that in the workspace, please.",
    "What was my first question?",
];

/// The parent: make the run, start the three generations one after another, say where it lives.
pub(crate) async fn run() -> Result<()> {
    let root = agentbox_providers::home::default_home()?.join("demo");
    let runs = Runs::new(&root);
    let rec = runs.create(None)?;
    let dir = runs.dir(&rec.id);
    println!("run {} lives in {}", rec.id, dir.display());
    let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
    for step in 1..=3 {
        let out = tokio::process::Command::new(&exe)
            .args(["demo-step", "--root"])
            .arg(&root)
            .args(["--run", &rec.id, "--step", &step.to_string()])
            .output()
            .await
            .map_err(|e| Error::io(e, "starting a generation"))?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            return Err(Error::unknown(format!(
                "generation {step} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let end = read_status(&dir)?;
    println!(
        "the run is {:?} at generation {}; its conversation is in {}, its tool calls in {}",
        end.status,
        end.generation,
        dir.join("store.db").display(),
        dir.join("ledger.db").display()
    );
    println!(
        "read it from outside: agentbox runs status {} --root {}",
        rec.id,
        root.display()
    );
    Ok(())
}

/// One generation, in a process of its own.
pub(crate) async fn step(root: &Path, id: &str, step: usize) -> Result<()> {
    let question = *QUESTIONS
        .get(step.wrapping_sub(1))
        .ok_or_else(|| Error::invalid(format!("--step {step}: 1 to 3")))?;
    let runs = Runs::new(root);
    let run = runs.open(id).await?;
    let ctx = Ctx::background();
    let config = TransportConfig::from_toml(
        "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\n",
    )?;
    let providers = config
        .registry_providers(&Default::default(), &crate::boxes::environment()?)
        .await?;
    let transport = Transport::new(
        config,
        TransportHost {
            providers,
            documents: run.documents(),
            session: id.to_string(),
            labels: BTreeMap::from([("agentbox-demo".to_string(), id.to_string())]),
            on_lost: None,
        },
    )?;
    let env = transport
        .env("chat")
        .ok_or_else(|| Error::unknown("the demo's config names hands"))?;
    let ledger = Arc::new(SqliteLedger::open(&run.dir().join("ledger.db"))?);
    let recorder = Recorder::open(ledger, id).await?;
    let model = match step {
        1 => ScriptedModel::new()
            .then_call("bash", json!({"command": "hostname"}))
            .then(|c| Reply {
                text: format!("The box's machine is called {}.", last_tool_text(c).trim()),
                tool_calls: vec![],
            }),
        2 => ScriptedModel::new()
            .then(|c| {
                let name = c
                    .iter()
                    .rev()
                    .find(|m| m.role == "assistant" && !text_of(m).is_empty())
                    .map(|m| text_of(m).to_string())
                    .unwrap_or_default();
                Reply {
                    text: String::new(),
                    tool_calls: vec![agent::ToolCall {
                        id: "note".into(),
                        name: "write".into(),
                        args: json!({"path": "note.md", "content": format!("{name}\n")}),
                    }],
                }
            })
            .then(|_| Reply {
                text: "Noted in note.md.".into(),
                tool_calls: vec![],
            }),
        _ => ScriptedModel::new()
            .then_call("read", json!({"path": "note.md"}))
            .then(|c| {
                let first = c.iter().find(|m| m.role == "user").map(text_of).unwrap_or("(none)");
                Reply {
                    text: format!(
                        "Your first question was \"{first}\", and note.md says: {}",
                        last_tool_text(c).trim()
                    ),
                    tool_calls: vec![],
                }
            }),
    };
    let answer = agent::answer(&run, &model, &*env, Some(&recorder), question, &ctx).await?;
    let box_id = env.id();
    println!(
        "generation {} (pid {}): asked \"{question}\"\n  tool call ran in box {box_id}\n  answered: {answer}",
        run.generation(),
        std::process::id()
    );
    if step == 3 {
        let ended = transport.destroy(&ctx).await?;
        println!(
            "  ended the box{} {}",
            if ended.len() == 1 { "" } else { "es" },
            ids(&ended)
        );
    } else {
        // The box stays for the next generation, which finds it in the run's documents.
        transport.release();
    }
    let rec = run.release().await?;
    println!(
        "  released: {:?}, {} messages in the store",
        rec.status,
        message_count(&runs, id)?
    );
    Ok(())
}

fn ids(ids: &[agentbox_core::SandboxId]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn message_count(runs: &Runs, id: &str) -> Result<usize> {
    let store = agentbox_runs::Store::read(&runs.dir(id).join("store.db"))?;
    Ok(store.messages()?.len())
}

fn last_tool_text(c: &[agentbox_runs::Message]) -> String {
    c.iter()
        .rev()
        .find(|m| m.role == "tool")
        .map(|m| text_of(m).to_string())
        .unwrap_or_default()
}

/// The hidden arguments of one generation.
#[derive(clap::Args)]
pub(crate) struct StepArgs {
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long)]
    pub run: String,
    #[arg(long)]
    pub step: usize,
}
