//! `agentbox runs agent` (hidden): a scripted agent needing no key, for the tests and for
//! trying a move by hand. It opens a run, counts to `--steps` one tool call a step in the run's
//! workspace, honours a planned move at each step boundary, and releases the run; it prints
//! `kept SEQ ROLE` as each message becomes durable, what the tests count as acknowledged.

use std::time::Duration;

use agentbox_core::{Ctx, Result};
use agentbox_runs::agent::{self, Reply, ToolCall, Turn};
use agentbox_runs::{Message, Runs};
use async_trait::async_trait;
use serde_json::json;

/// Counts to `steps`, one tool call a step, going on from where an earlier generation was.
struct Counter {
    steps: usize,
    step_time: Duration,
}

#[async_trait]
impl agent::Model for Counter {
    async fn respond(&self, conversation: &[Message], _ctx: &Ctx) -> Result<Reply> {
        let asked = conversation.iter().rposition(|m| m.role == "user").unwrap_or(0);
        // A call that failed (one interrupted with its holder) is made again.
        let done = conversation[asked..]
            .iter()
            .filter(|m| m.role == "tool" && m.content["is_error"] != json!(true))
            .count();
        if done >= self.steps {
            return Ok(Reply {
                text: format!("Counted to {}.", self.steps),
                tool_calls: vec![],
                wait_ms: None,
            });
        }
        let n = done + 1;
        Ok(Reply {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: format!("step-{n}"),
                name: "bash".into(),
                args: json!({
                    "command": format!("echo \"{n} on $(hostname)\" >> count.log; sleep {}", self.step_time.as_secs_f64())
                }),
            }],
            wait_ms: None,
        })
    }
}

pub(crate) async fn run(runs: &Runs, id: &str, steps: usize, step_time: Duration, claim_wait: Duration) -> Result<i32> {
    let run = runs.open_within(id, claim_wait).await?;
    let _keeper = run.keep_claim();
    println!(
        "generation {} on host {} (pid {})",
        run.generation(),
        runs.host(),
        std::process::id()
    );
    run.store().on_kept(|seq, role| {
        println!("kept {seq} {role}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    });
    if let Some(note) = agent::note_move(&run, runs.host())? {
        println!("{note}");
    }
    // Its programs written down: a next generation that takes the run over ends them.
    let env = run.host_env()?;
    let conversation = run.store().messages()?;
    let question = format!("Count to {steps}, one step at a time.");
    let question = (!agent::unfinished(&conversation)).then_some(question.as_str());
    let model = Counter { steps, step_time };
    let turn = agent::work(&run, &model, &env, None, question, &Ctx::background()).await?;
    match &turn {
        Turn::Answered(text) => println!("answered: {text}"),
        Turn::Moving(m) => println!("moving to {}: letting the run go at a step boundary", m.to),
        Turn::Parking(until) => {
            let rec = run.park(*until).await?;
            println!("parked: {}", crate::runs::show(&rec));
            return Ok(0);
        }
    }
    let rec = run.release().await?;
    println!("released: {}", crate::runs::show(&rec));
    Ok(0)
}
