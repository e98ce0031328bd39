//! The agent loop: every step persisted as it happens, tool calls through an environment, a
//! conversation that the next generation continues.

use agentbox_core::{Clock, Ctx, ErrorCode};
use agentbox_hands::HostEnv;
use agentbox_runs::Runs;
use agentbox_runs::agent::{self, Reply, ScriptedModel, text_of};
use serde_json::json;

#[tokio::test]
async fn each_step_is_in_the_store_before_the_next_and_a_later_generation_goes_on() {
    let root = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let env = HostEnv::new(work.path().to_string_lossy()).unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("chat")).unwrap();
    let ctx = Ctx::background();

    let run = runs.open("chat").await.unwrap();
    // A model that calls a tool, then has nothing more to say: the call and its result are
    // kept although the turn fails.
    let model = ScriptedModel::new().then_call("write", json!({"path": "a.txt", "content": "one"}));
    let e = agent::answer(&run, &model, &env, None, "write a file", &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
    let roles: Vec<String> = run.store().messages().unwrap().into_iter().map(|m| m.role).collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
    assert_eq!(std::fs::read_to_string(work.path().join("a.txt")).unwrap(), "one");
    run.release().await.unwrap();

    let run = runs.open("chat").await.unwrap();
    let model = ScriptedModel::new().then(|c| Reply {
        text: format!(
            "{} messages; you first asked: {}",
            c.len(),
            c.iter().find(|m| m.role == "user").map(text_of).unwrap_or("")
        ),
        tool_calls: vec![],
        wait_ms: None,
    });
    let said = agent::answer(&run, &model, &env, None, "what did I ask?", &ctx)
        .await
        .unwrap();
    assert_eq!(said, "4 messages; you first asked: write a file");
    let last = run.store().messages().unwrap().pop().unwrap();
    assert_eq!((last.role.as_str(), last.generation), ("assistant", 2));
    // Parking: past the threshold the run is released with a deadline; under it, kept.
    let run = match agent::park_if_waiting(run, std::time::Duration::from_secs(5), agent::PARK_THRESHOLD)
        .await
        .unwrap()
    {
        Err(run) => run,
        Ok(_) => panic!("5 s is under the threshold"),
    };
    let parked = agent::park_if_waiting(run, std::time::Duration::from_secs(120), agent::PARK_THRESHOLD)
        .await
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(parked.status, agentbox_runs::RunStatus::Parked);
    assert!(runs.due(u64::MAX).unwrap().iter().any(|r| r.id == "chat"));
}

#[tokio::test]
async fn a_move_stops_the_turn_at_a_step_boundary_and_the_next_generation_goes_on() {
    use agentbox_runs::agent::Turn;
    let root = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let env = HostEnv::new(work.path().to_string_lossy()).unwrap();
    let here = Runs::new(root.path()).as_host("host-a");
    here.create(Some("mv")).unwrap();
    let ctx = Ctx::background();
    let run = here.open("mv").await.unwrap();
    let dir = run.dir().to_path_buf();
    // The move is asked during the first step's tool call: the step ends whole, then the turn.
    let model = ScriptedModel::new()
        .then_call(
            "bash",
            json!({"command": format!("echo one >> steps; echo '{{\"to\":\"docker\",\"by\":\"t\",\"asked_ms\":1}}' > {}/move.json", dir.display())}),
        )
        .then_call("bash", json!({"command": "echo two >> steps"}));
    let turn = agent::work(&run, &model, &env, None, Some("count"), &ctx)
        .await
        .unwrap();
    assert!(matches!(&turn, Turn::Moving(m) if m.to == "docker"), "{turn:?}");
    let conv = run.store().messages().unwrap();
    let roles: Vec<&str> = conv.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "system"]);
    assert!(text_of(&conv[3]).contains("Moving to docker") && text_of(&conv[3]).contains("host-a"));
    assert!(agent::unfinished(&conv));
    assert_eq!(std::fs::read_to_string(work.path().join("steps")).unwrap(), "one\n");
    run.release().await.unwrap();

    let there = Runs::new(root.path()).as_host("host-b").started_by("docker");
    let run = there.open("mv").await.unwrap();
    assert!(
        agent::note_move(&run, "host-b")
            .unwrap()
            .unwrap()
            .contains("a planned move to docker")
    );
    let turn = agent::work(&run, &model, &env, None, None, &ctx).await;
    // The scripted model's second step runs here; then it has nothing more to say.
    assert_eq!(turn.unwrap_err().code(), ErrorCode::Invalid);
    assert_eq!(
        std::fs::read_to_string(work.path().join("steps")).unwrap(),
        "one\ntwo\n"
    );
    let conv = run.store().messages().unwrap();
    assert_eq!(conv.iter().filter(|m| m.role == "user").count(), 1);
}

#[tokio::test]
async fn a_generation_taking_over_mid_step_answers_the_lost_call_and_a_fenced_holder_runs_no_tool() {
    use agentbox_runs::agent::{INTERRUPTED, Turn};
    let root = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let env = HostEnv::new(work.path().to_string_lossy()).unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("lost")).unwrap();
    let ctx = Ctx::background();
    // A holder died with its tool call unanswered: the question and the call are in the store.
    let run = runs.open("lost").await.unwrap();
    run.store().append("user", &json!({"text": "go"})).unwrap();
    run.store()
        .append(
            "assistant",
            &json!({"text": "", "tool_calls": [{"id": "c1", "name": "bash", "args": {"command": "true"}}]}),
        )
        .unwrap();
    run.release().await.unwrap();
    let run = runs.open("lost").await.unwrap();
    let model = ScriptedModel::new().then(|c| Reply {
        text: format!("last said: {}", text_of(c.last().unwrap())),
        tool_calls: vec![],
        wait_ms: None,
    });
    let turn = agent::work(&run, &model, &env, None, None, &ctx).await.unwrap();
    assert_eq!(turn, Turn::Answered(format!("last said: {INTERRUPTED}")));
    let conv = run.store().messages().unwrap();
    assert_eq!(conv[2].content["call"], "c1");
    assert_eq!(conv[2].content["is_error"], true);

    // A holder whose claim is taken while its model answers runs none of the tools it asked.
    let path = run.dir().join("store.db");
    let model = ScriptedModel::new().then(move |_| {
        agentbox_runs::Store::take(&path, 99, agentbox_runs::Journal::Wal).unwrap();
        Reply {
            text: String::new(),
            tool_calls: vec![agent::ToolCall {
                id: "c2".into(),
                name: "write".into(),
                args: json!({"path": "late.txt", "content": "x"}),
            }],
            wait_ms: None,
        }
    });
    let e = agent::work(&run, &model, &env, None, Some("again"), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Fenced);
    assert!(!work.path().join("late.txt").exists());
}

/// The loop parks a run by itself: a step that can go on only after a wait past the threshold
/// (60 s) stops the turn, tells the agent, and releases the run with its deadline; the run is
/// due for a supervisor exactly then (on a clock the test moves), and the next generation
/// goes on with the unfinished turn. A wait under the threshold is waited in place.
#[tokio::test]
async fn a_step_that_waits_past_the_threshold_parks_the_run_until_its_deadline() {
    use agentbox_runs::agent::{Waits, Worked, work_or_park};
    use agentbox_testing::fake::FakeClock;
    use std::time::Duration;
    let root = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let env = HostEnv::new(work.path().to_string_lossy()).unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("poll")).unwrap();
    let ctx = Ctx::background();
    let clock = FakeClock::manual(1_800_000_000_000);
    let waits = Waits {
        clock: clock.clone(),
        park_threshold: agent::PARK_THRESHOLD,
    };
    assert_eq!(agent::PARK_THRESHOLD, Duration::from_secs(60), "the seed's threshold");

    let run = runs.open("poll").await.unwrap();
    let model = ScriptedModel::new()
        .then_call("write", json!({"path": "started", "content": "yes"}))
        .then_wait(Duration::from_secs(120));
    let parked = match work_or_park(run, &model, &env, None, Some("wait for the build"), &waits, &ctx)
        .await
        .unwrap()
    {
        Worked::Parked(record) => record,
        _ => panic!("a 120 s wait parks the run"),
    };
    assert_eq!(parked.status, agentbox_runs::RunStatus::Parked);
    let deadline = 1_800_000_000_000 + 120_000;
    assert_eq!(parked.deadline_ms, Some(deadline));
    assert_eq!(std::fs::read_to_string(work.path().join("started")).unwrap(), "yes");
    // Not due a moment early; due at its deadline.
    assert!(runs.due(clock.now_ms()).unwrap().is_empty());
    clock.advance(Duration::from_millis(119_999));
    assert!(runs.due(clock.now_ms()).unwrap().is_empty(), "not before its deadline");
    clock.advance(Duration::from_millis(1));
    let due: Vec<String> = runs.due(clock.now_ms()).unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(due, ["poll"]);

    // The supervisor starts it: the next generation goes on with the unfinished turn, told
    // why it parked; a 5 s wait is waited in place on the clock, not parked.
    let run = runs.open("poll").await.unwrap();
    assert_eq!(run.generation(), 2);
    let conversation = run.store().messages().unwrap();
    assert!(agent::unfinished(&conversation));
    let note = conversation.last().unwrap();
    assert_eq!(note.role, "system");
    assert!(
        text_of(note).starts_with("Parked: the next step waits 120s, past the 60s threshold"),
        "{}",
        text_of(note)
    );
    let model = ScriptedModel::new().then_wait(Duration::from_secs(5)).then(|_| Reply {
        text: "built".into(),
        ..Default::default()
    });
    let before = clock.now_ms();
    let task = {
        let waits = waits.clone();
        tokio::spawn(async move { work_or_park(run, &model, &env, None, None, &waits, &Ctx::background()).await })
    };
    // The wait is on the test's clock: it ends when the clock is moved past it.
    while !task.is_finished() {
        clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match task.await.unwrap().unwrap() {
        Worked::Answered(text, run) => {
            assert_eq!(text, "built");
            run.release().await.unwrap();
        }
        _ => panic!("a 5 s wait is waited in place"),
    }
    assert!(clock.now_ms() >= before + 5_000, "it waited on the clock");

    // Waits one after another add up: 30 s waited in place, then 31 s more parks the run.
    let run = runs.open("poll").await.unwrap();
    let model = ScriptedModel::new()
        .then_wait(Duration::from_secs(30))
        .then_wait(Duration::from_secs(31));
    let task = {
        let waits = waits.clone();
        let env = HostEnv::new(work.path().to_string_lossy()).unwrap();
        tokio::spawn(
            async move { work_or_park(run, &model, &env, None, Some("again"), &waits, &Ctx::background()).await },
        )
    };
    let started = clock.now_ms();
    while !task.is_finished() {
        clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match task.await.unwrap().unwrap() {
        Worked::Parked(record) => {
            let until = record.deadline_ms.unwrap();
            assert!(
                until >= started + 61_000,
                "parked for the second wait, after the first: {until}"
            );
        }
        _ => panic!("30 s and then 31 s of waiting parks the run"),
    }
}
