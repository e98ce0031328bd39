//! The agent loop that makes runs useful: a model answers, its tool calls go to an
//! [`ExecutionEnv`] (a transport's box), and the conversation is persisted in the run's store
//! after every step, so a run released between steps picks up on another host at the next
//! generation. The model is a trait: the [`ScriptedModel`] (responses given in advance, as the
//! seed's faux model) needs no key, and a real model client can take its place.

use std::sync::Mutex;

use agentbox_core::{Ctx, Error, Result};
use agentbox_hands::ExecutionEnv;
use agentbox_transport::ledger::Recorder;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::run::Run;
use crate::store::Message;

/// The most model steps one question may take.
pub const MAX_STEPS: usize = 16;

/// A tool call a model asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Its id, which the result names.
    pub id: String,
    /// The tool (`bash`, `read`, …).
    pub name: String,
    /// Its arguments.
    pub args: Value,
}

/// What a model says at one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Its text.
    pub text: String,
    /// The tools it calls; none ends the turn.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Not a step yet: the model can go on only after this many milliseconds (a retry after a
    /// rate limit, a long poll). Never kept in the conversation. Past the park threshold the
    /// run parks ([`work_or_park`]); under it the loop waits in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// A model: the conversation so far in, the next step out.
#[async_trait]
pub trait Model: Send + Sync {
    /// The next step.
    async fn respond(&self, conversation: &[Message], ctx: &Ctx) -> Result<Reply>;
}

type Step = Box<dyn Fn(&[Message]) -> Reply + Send + Sync>;

/// Responses given in advance, one a step, each able to read the conversation (the seed's faux
/// model). Past its last response it fails.
///
/// ```
/// use agentbox_runs::agent::{Reply, ScriptedModel};
/// let model = ScriptedModel::new()
///     .then_call("bash", serde_json::json!({"command": "hostname"}))
///     .then(|conversation| Reply { text: format!("{} messages so far", conversation.len()), ..Default::default() });
/// ```
#[derive(Default)]
pub struct ScriptedModel {
    steps: Mutex<std::collections::VecDeque<Step>>,
}

impl ScriptedModel {
    /// A model with no responses yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Then a response computed from the conversation.
    pub fn then(self, f: impl Fn(&[Message]) -> Reply + Send + Sync + 'static) -> Self {
        self.steps.lock().unwrap().push_back(Box::new(f));
        self
    }

    /// Then a call of `tool` with `args`.
    pub fn then_call(self, tool: &str, args: Value) -> Self {
        let tool = tool.to_string();
        self.then(move |conv| Reply {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: format!("call-{}", conv.len() + 1),
                name: tool.clone(),
                args: args.clone(),
            }],
            wait_ms: None,
        })
    }

    /// Then no step yet: the model can go on only after `wait`.
    pub fn then_wait(self, wait: std::time::Duration) -> Self {
        self.then(move |_| Reply {
            wait_ms: Some(wait.as_millis() as u64),
            ..Default::default()
        })
    }
}

#[async_trait]
impl Model for ScriptedModel {
    async fn respond(&self, conversation: &[Message], _ctx: &Ctx) -> Result<Reply> {
        let step = self
            .steps
            .lock()
            .unwrap()
            .pop_front()
            .ok_or_else(|| Error::invalid("the scripted model has no response left"))?;
        Ok(step(conversation))
    }
}

/// The text of a message (a user's question, an assistant's answer, a tool's result).
pub fn text_of(m: &Message) -> &str {
    m.content.get("text").and_then(|t| t.as_str()).unwrap_or("")
}

/// How long a run's work may only wait before it parks (the seed's 60 s).
pub const PARK_THRESHOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// How the loop waits: on which clock, and past how long a wait it parks the run instead.
#[derive(Clone)]
pub struct Waits {
    /// Where time comes from (a test's clock moves by hand).
    pub clock: std::sync::Arc<dyn agentbox_core::Clock>,
    /// A wait this long or longer parks the run ([`PARK_THRESHOLD`] by default).
    pub park_threshold: std::time::Duration,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            clock: std::sync::Arc::new(agentbox_core::SystemClock),
            park_threshold: PARK_THRESHOLD,
        }
    }
}

/// A run whose work only waits `wait` (a retry, a long poll) parks when that is past
/// `threshold`: released with its deadline, for a supervisor to start again. Otherwise the run
/// is handed back to wait in place.
pub async fn park_if_waiting(
    run: Run,
    wait: std::time::Duration,
    threshold: std::time::Duration,
) -> Result<std::result::Result<crate::RunRecord, Run>> {
    if wait < threshold {
        return Ok(Err(run));
    }
    use agentbox_core::Clock;
    let deadline = agentbox_core::SystemClock.now_ms() + wait.as_millis() as u64;
    run.store().append(
        "system",
        &json!({ "text": format!("Parked: the work waits {}s, past the {}s threshold.", wait.as_secs(), threshold.as_secs()) }),
    )?;
    Ok(Ok(run.park(deadline).await?))
}

/// Tell the agent, in its conversation, that the run moved here from another host (or to
/// the target a planned move named): the host before and after, and the generation.
pub fn note_move(run: &Run, here: &str) -> Result<Option<String>> {
    let Some(prev) = run.previous() else { return Ok(None) };
    let planned = run
        .moved()
        .map(|m| format!(" (a planned move to {})", m.to))
        .unwrap_or_default();
    if prev.host == here && planned.is_empty() {
        return Ok(None);
    }
    let note = format!(
        "This run moved from host {} to host {here} at a step boundary{planned}: generation {} continues here.",
        prev.host,
        run.generation()
    );
    run.store().append("system", &json!({ "text": note }))?;
    Ok(Some(note))
}

/// How a turn of [`work`] ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Turn {
    /// The model answered: its text.
    Answered(String),
    /// A move was asked, and the turn stopped at a step boundary, the agent told: release
    /// the run for the driver to start the next generation on the target.
    Moving(crate::MoveRequest),
    /// The next step waits past the park threshold, and the turn stopped, the agent told: park
    /// the run until this time (milliseconds since the epoch; [`Run::park`]).
    Parking(u64),
}

/// Whether the conversation's last turn is unfinished (its last message is not an answer):
/// what a generation that took over mid-turn goes on with, asking nothing new.
pub fn unfinished(conversation: &[Message]) -> bool {
    // Notes of moves and parking are not turns.
    match conversation.iter().rev().find(|m| m.role != "system") {
        None => false,
        Some(m) if m.role == "assistant" => m
            .content
            .get("tool_calls")
            .and_then(|c| c.as_array())
            .is_some_and(|c| !c.is_empty()),
        Some(_) => true,
    }
}

/// The text of the result given to a tool call whose holder was lost during it.
pub const INTERRUPTED: &str = "interrupted: the holder of the run was lost during this call; its outcome is unknown";

/// A generation going on with an unfinished turn first answers every tool call the last one
/// made and never answered (it died mid-step): an error result each, so the conversation the
/// model reads is whole and the model decides whether to call again.
fn answer_interrupted(store: &crate::Store) -> Result<()> {
    let conversation = store.messages()?;
    let Some(at) = conversation.iter().rposition(|m| m.role == "assistant") else {
        return Ok(());
    };
    let calls: Vec<ToolCall> = conversation[at]
        .content
        .get("tool_calls")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    for call in calls {
        let answered = conversation[at..]
            .iter()
            .any(|m| m.role == "tool" && m.content.get("call").and_then(|c| c.as_str()) == Some(call.id.as_str()));
        if !answered {
            store.append(
                "tool",
                &json!({ "call": call.id, "name": call.name, "text": INTERRUPTED, "is_error": true }),
            )?;
        }
    }
    Ok(())
}

/// Ask `question`: the model's steps until it answers, each tool call on `env` (recorded in
/// the ledger when a recorder is given), every message persisted as it happens.
pub async fn answer(
    run: &Run,
    model: &dyn Model,
    env: &dyn ExecutionEnv,
    recorder: Option<&Recorder>,
    question: &str,
    ctx: &Ctx,
) -> Result<String> {
    // It neither moves nor parks: a wait is waited in place.
    let waits = Waits {
        park_threshold: std::time::Duration::MAX,
        ..Default::default()
    };
    match turn(run, model, env, recorder, Some(question), false, &waits, ctx).await? {
        Turn::Answered(text) => Ok(text),
        Turn::Moving(_) | Turn::Parking(_) => Err(Error::unknown("answer asked for no move and no parking")),
    }
}

/// [`answer`] that honours a planned move: after each step (the model's reply and every tool
/// call's result persisted) it reads whether a move was asked ([`Run::move_asked`]), and if so
/// tells the agent it is leaving and stops, never mid-step. With no `question` it goes on
/// with the conversation's unfinished turn ([`unfinished`]), as a generation that took over
/// does.
pub async fn work(
    run: &Run,
    model: &dyn Model,
    env: &dyn ExecutionEnv,
    recorder: Option<&Recorder>,
    question: Option<&str>,
    ctx: &Ctx,
) -> Result<Turn> {
    work_with(run, model, env, recorder, question, &Waits::default(), ctx).await
}

/// [`work`] on `waits`' clock and threshold: a step the model can take only after a wait past
/// the threshold stops the turn (the agent told) with [`Turn::Parking`].
pub async fn work_with(
    run: &Run,
    model: &dyn Model,
    env: &dyn ExecutionEnv,
    recorder: Option<&Recorder>,
    question: Option<&str>,
    waits: &Waits,
    ctx: &Ctx,
) -> Result<Turn> {
    turn(run, model, env, recorder, question, true, waits, ctx).await
}

/// What became of a run handed to [`work_or_park`].
pub enum Worked {
    /// The model answered; the run is still held.
    Answered(String, Run),
    /// A move was asked and the turn stopped at a step boundary; the run is still held, to
    /// release for the move's driver.
    Moving(crate::MoveRequest, Run),
    /// The next step waited past the threshold: the run is parked until its deadline, when a
    /// supervisor (`agentbox runs supervise`, [`crate::Runs::due`]) starts it again.
    Parked(crate::RunRecord),
}

/// [`work_with`], and a run whose next step waits past the threshold parked by the loop
/// itself: released with its deadline, so no host holds a run that only waits.
///
/// ```no_run
/// # async fn f(runs: agentbox_runs::Runs, env: &dyn agentbox_hands::ExecutionEnv) -> agentbox_core::Result<()> {
/// use agentbox_runs::agent::{ScriptedModel, Waits, Worked, work_or_park};
/// let run = runs.open("chat").await?;
/// let model = ScriptedModel::new().then_wait(std::time::Duration::from_secs(600));
/// match work_or_park(run, &model, env, None, Some("poll the build"), &Waits::default(), &agentbox_core::Ctx::background()).await? {
///     Worked::Parked(record) => println!("parked until {:?}", record.deadline_ms),
///     Worked::Answered(text, run) => { println!("{text}"); run.release().await?; }
///     Worked::Moving(_, run) => { run.release().await?; }
/// }
/// # Ok(()) }
/// ```
pub async fn work_or_park(
    run: Run,
    model: &dyn Model,
    env: &dyn ExecutionEnv,
    recorder: Option<&Recorder>,
    question: Option<&str>,
    waits: &Waits,
    ctx: &Ctx,
) -> Result<Worked> {
    match work_with(&run, model, env, recorder, question, waits, ctx).await? {
        Turn::Answered(text) => Ok(Worked::Answered(text, run)),
        Turn::Moving(m) => Ok(Worked::Moving(m, run)),
        Turn::Parking(until) => Ok(Worked::Parked(run.park(until).await?)),
    }
}

#[allow(clippy::too_many_arguments)]
async fn turn(
    run: &Run,
    model: &dyn Model,
    env: &dyn ExecutionEnv,
    recorder: Option<&Recorder>,
    question: Option<&str>,
    moves: bool,
    waits: &Waits,
    ctx: &Ctx,
) -> Result<Turn> {
    let store = run.store();
    match question {
        Some(question) => {
            store.append("user", &json!({ "text": question }))?;
        }
        None => answer_interrupted(store)?,
    }
    let mut waited = 0u64;
    for _ in 0..MAX_STEPS {
        let conversation = store.messages()?;
        let reply = model.respond(&conversation, ctx).await?;
        if let Some(wait) = reply.wait_ms {
            let now = waits.clock.now_ms();
            let until = now.saturating_add(wait);
            // Waits one after another add up: many short ones hold a host as one long one.
            waited = waited.saturating_add(wait);
            if std::time::Duration::from_millis(waited) >= waits.park_threshold {
                let note = format!(
                    "Parked: the next step waits {}s, past the {}s threshold; the run is released until {}.",
                    waited / 1000,
                    waits.park_threshold.as_secs(),
                    agentbox_core::rfc3339(i64::try_from(until).unwrap_or(i64::MAX))
                );
                store.append("system", &json!({ "text": note }))?;
                tracing::info!(
                    wait_ms = wait,
                    until_ms = until,
                    generation = run.generation(),
                    "parking: the next step waits past the threshold"
                );
                return Ok(Turn::Parking(until));
            }
            tracing::debug!(
                wait_ms = wait,
                "the next step waits, under the park threshold: waiting in place"
            );
            ctx.run(waits.clock.sleep_until(until)).await?;
            continue;
        }
        waited = 0;
        store.append(
            "assistant",
            &json!({ "text": reply.text, "tool_calls": reply.tool_calls }),
        )?;
        if reply.tool_calls.is_empty() {
            return Ok(Turn::Answered(reply.text));
        }
        for call in &reply.tool_calls {
            // A holder whose claim was taken while the model answered runs no tool: the check
            // writes nothing and fails `fenced`. (A tool already running is ended by the next
            // generation's claim, through the programs written down: `crate::programs`.)
            store.fenced(|_| Ok(()))?;
            let result = match recorder {
                Some(r) => r.call(&call.name, env, call.args.clone(), ctx).await?,
                None => agentbox_hands::tools::call(&call.name, env, call.args.clone(), ctx).await,
            };
            store.append(
                "tool",
                &json!({ "call": call.id, "name": call.name, "text": result.text(), "is_error": result.is_error }),
            )?;
        }
        // A step boundary: every message of the step is durable.
        let asked = if moves {
            run.move_asked().unwrap_or_else(|e| {
                tracing::warn!("the move request cannot be read, and no move is made: {e}");
                None
            })
        } else {
            None
        };
        if let Some(req) = asked {
            let note = format!(
                "Moving to {} at a step boundary: generation {} lets the run go on host {}; the next generation continues there.",
                req.to,
                run.generation(),
                run.record().holder.as_ref().map(|h| h.host.as_str()).unwrap_or("?")
            );
            store.append("system", &json!({ "text": note }))?;
            tracing::info!(to = %req.to, generation = run.generation(), "leaving for a move at a step boundary");
            return Ok(Turn::Moving(req));
        }
    }
    Err(Error::too_large(format!(
        "the model took more than {MAX_STEPS} steps for one question"
    )))
}
