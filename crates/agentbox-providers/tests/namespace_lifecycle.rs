//! The lifecycle of namespace boxes on real boxes: names, sleep and wake, a moved deadline,
//! labels changed, snapshots and forks. Each box's end is watched from outside (its pid
//! namespace's processes), never by asking the provider, where the point is that the box ends
//! with no call from the host.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, Labels, Provider, Sandbox, SandboxId, Spec, Status};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_testing::conformance::Outside;
use agentbox_testing::outside::NamespaceView;

fn provider(root: &std::path::Path) -> Arc<dyn Provider> {
    Arc::new(
        NamespaceProvider::new(NamespaceOptions {
            runner: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
            ..NamespaceOptions::at(root).unwrap()
        })
        .unwrap(),
    )
}

fn view(root: &std::path::Path) -> NamespaceView {
    NamespaceView {
        boxes: root.join("namespace"),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `sh -c script` in `b`: its exit code and its stdout and stderr together.
async fn sh(b: &dyn Sandbox, script: &str) -> (i32, String) {
    let out = agentbox_testing::sh(b, script).await;
    (out.status.code, format!("{}{}", out.stdout_text(), out.stderr_text()))
}

async fn exec_err(b: &dyn Sandbox) -> agentbox_core::Error {
    b.exec(&["true".into()], &ExecOptions::default(), &Ctx::background())
        .await
        .err()
        .expect("the exec is refused")
}

/// Wait until the box has ended as seen from outside, at most `limit`.
async fn ended_within(v: &NamespaceView, id: &SandboxId, limit: Duration) -> bool {
    let t = tokio::time::Instant::now();
    while t.elapsed() < limit {
        if v.ended(id).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_box_outlives_its_first_deadline_and_ends_at_the_new_one_with_no_call() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let v = view(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(3)), &ctx).await.unwrap();
    let first = b.facts().ends_at_ms.unwrap();
    // Deadlines in the past or over 30 days ahead are refused, naming the operation.
    let e = p.extend(b.id(), now_ms() - 1, &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().starts_with("extend: "), "{e}");
    assert!(p.extend(b.id(), now_ms() + 31 * 86_400_000, &ctx).await.is_err());

    let later = first + 4_000;
    let e2 = p.extend(b.id(), later, &ctx).await.unwrap();
    assert_eq!(
        e2.facts().ends_at_ms,
        Some(later),
        "the answered handle says the new deadline"
    );
    // Past the first deadline the box runs, to a fresh provider too, whose facts say the new one.
    tokio::time::sleep(Duration::from_millis(first.saturating_sub(now_ms()) + 1_000)).await;
    assert!(!v.ended(b.id()).await, "alive past its first deadline");
    let fresh = provider(root.path());
    let again = fresh.attach(b.id(), &ctx).await.unwrap().expect("attached");
    assert_eq!(again.facts().ends_at_ms, Some(later));
    assert_eq!(sh(again.as_ref(), "echo alive").await, (0, "alive\n".into()));
    assert_eq!(
        b.status(&ctx).await.unwrap(),
        Status::Running,
        "an old handle sees the new deadline"
    );
    // And it ends at the new one, with no call.
    assert!(
        ended_within(
            &v,
            b.id(),
            Duration::from_millis(later.saturating_sub(now_ms()) + 3_000)
        )
        .await,
        "ended at the new deadline"
    );
    assert!(now_ms() + 200 >= later, "not before it");
    assert!(fresh.attach(b.id(), &ctx).await.unwrap().is_none());

    // An earlier deadline is kept too.
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    let sooner = now_ms() + 1_500;
    p.extend(b.id(), sooner, &ctx).await.unwrap();
    assert!(
        ended_within(&v, b.id(), Duration::from_secs(5)).await,
        "ended at the earlier deadline"
    );
    assert!(now_ms() + 200 >= sooner);
    let e = p.extend(b.id(), now_ms() + 60_000, &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Gone, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_box_keeps_its_files_loses_its_programs_refuses_programs_and_wakes() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let v = view(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    assert_eq!(b.facts().sleep.as_deref(), Some("files"));
    assert_eq!(b.facts().sleep_clock.as_deref(), Some("counting"));
    assert_eq!(
        sh(
            b.as_ref(),
            "echo kept > /workspace/w; echo home > /root/h; echo tmp > /tmp/t"
        )
        .await
        .0,
        0
    );
    let _long = b
        .exec(&["sleep".into(), "1000".into()], &ExecOptions::default(), &ctx)
        .await
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(v.boxes.join(b.id().name()).join("record.json")).unwrap()).unwrap();
    let (ns, init) = (
        record["facts"]["namespaces"]["pid"].as_u64().unwrap(),
        record["init_pid"].as_u64().unwrap() as u32,
    );
    assert!(NamespaceView::members(ns, init).len() >= 3, "init, runner, sleep");

    p.sleep(b.id(), &ctx).await.unwrap();
    p.sleep(b.id(), &ctx).await.unwrap(); // sleeping a sleeping box is no error
    assert_eq!(
        NamespaceView::members(ns, init),
        vec![(init, 1)],
        "the init alone is left"
    );
    // Refused, through the old handle and a fresh provider's, which lists it as sleeping.
    let e = exec_err(b.as_ref()).await;
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    assert_eq!(b.status(&ctx).await.unwrap(), Status::Sleeping);
    let fresh = provider(root.path());
    let listed = fresh.list(&Labels::new(), &ctx).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id(), b.id());
    assert_eq!(listed[0].status(&ctx).await.unwrap(), Status::Sleeping);
    let attached = fresh.attach(b.id(), &ctx).await.unwrap().unwrap();
    assert_eq!(attached.status(&ctx).await.unwrap(), Status::Sleeping);
    let e = exec_err(attached.as_ref()).await;
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    assert!(attached.download("/workspace/w", 100, &ctx).await.is_err());
    // Its deadline still stands, and can move while it sleeps.
    assert!(!v.ended(b.id()).await);

    let woken = fresh.wake(b.id(), &ctx).await.unwrap();
    assert_eq!(woken.status(&ctx).await.unwrap(), Status::Running);
    let (code, out) = sh(
        woken.as_ref(),
        "cat /workspace/w /root/h /tmp/t; pgrep -c sleep || true",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "kept\nhome\ntmp\n0\n", "files kept, programs gone");
    // The old handle works again too, and waking an awake box answers it.
    assert_eq!(sh(b.as_ref(), "echo again").await, (0, "again\n".into()));
    let w2 = p.wake(b.id(), &ctx).await.unwrap();
    assert_eq!(w2.status(&ctx).await.unwrap(), Status::Running);
    b.destroy(&ctx).await.unwrap();
    let e = p.wake(b.id(), &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Gone, "{e}");
    assert!(e.message().starts_with("wake: "), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_box_whose_deadline_passes_ends_and_is_removed() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let v = view(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(3)), &ctx).await.unwrap();
    p.sleep(b.id(), &ctx).await.unwrap();
    assert!(!v.ended(b.id()).await, "asleep, not ended");
    assert!(
        ended_within(&v, b.id(), Duration::from_secs(6)).await,
        "a sleeping box still ends at its deadline, with no call"
    );
    let fresh = provider(root.path());
    assert!(fresh.list(&Labels::new(), &ctx).await.unwrap().is_empty());
    assert!(!v.boxes.join(b.id().name()).exists(), "what was left of it is removed");
    let e = fresh.wake(b.id(), &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Gone, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forks_boxes_start_with_the_parents_files_and_diverge() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let parent = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    assert_eq!(
        sh(
            parent.as_ref(),
            "echo p > /workspace/f; mkdir -p /root/d; echo h > /root/d/h; ln -s f /workspace/l"
        )
        .await
        .0,
        0
    );
    let spec = Spec {
        labels: labels(&[("fork", "yes")]),
        ..Spec::new(Duration::from_secs(120))
    };
    for bad in [0, agentbox_core::MAX_FORK + 1] {
        let e = p.fork(parent.id(), bad, &spec, &ctx).await.err().unwrap();
        assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    }
    let with_snapshot = Spec {
        snapshot: Some("s".into()),
        ..spec.clone()
    };
    let e = p.fork(parent.id(), 1, &with_snapshot, &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");

    let kids = p.fork(parent.id(), 2, &spec, &ctx).await.unwrap();
    assert_eq!(kids.len(), 2);
    assert_ne!(kids[0].id(), kids[1].id());
    for k in &kids {
        assert_eq!(k.labels(), &spec.labels);
        let (code, out) = sh(
            k.as_ref(),
            "cat /workspace/f /root/d/h; readlink /workspace/l; echo x >> /workspace/f",
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "p\nh\nf\n"),
            "a child has the parent's files, and may write them"
        );
    }
    assert_eq!(sh(kids[0].as_ref(), "echo k0 > /workspace/g").await.0, 0);
    assert_eq!(sh(parent.as_ref(), "echo p2 > /workspace/h2").await.0, 0);
    assert_eq!(
        sh(kids[1].as_ref(), "ls /workspace").await.1,
        "f\nl\n",
        "a sibling's and the parent's later writes are not seen"
    );
    assert_eq!(
        sh(parent.as_ref(), "ls /workspace; cat /workspace/f").await.1,
        "f\nh2\nl\np\n"
    );
    assert_eq!(sh(kids[0].as_ref(), "ls /workspace").await.1, "f\ng\nl\n");
    // Each lives on its own.
    kids[0].destroy(&ctx).await.unwrap();
    assert_eq!(sh(kids[1].as_ref(), "echo on").await.1, "on\n");
    assert_eq!(sh(parent.as_ref(), "echo on").await.1, "on\n");
    let e = p
        .fork(
            &SandboxId::new("namespace", "0000000000000000").unwrap(),
            1,
            &spec,
            &ctx,
        )
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Gone, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_makes_boxes_with_its_files_and_its_name_is_taken_once() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    assert_eq!(
        sh(b.as_ref(), "echo w > /workspace/w; printf '#!/bin/sh\\necho ran\\n' > /workspace/x; chmod 755 /workspace/x; echo h > /root/h; echo t > /tmp/t").await.0,
        0
    );
    let e = p.snapshot(b.id(), "Bad_Name", &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    let s = p.snapshot(b.id(), "base", &ctx).await.unwrap();
    assert_eq!((s.name.as_str(), s.provider.as_str()), ("base", "namespace"));
    assert_eq!(s.from.as_ref(), Some(b.id()));
    assert!(s.bytes.unwrap() > 0 && s.created_at_ms.is_some() && !s.memory, "{s:?}");
    let e = p.snapshot(b.id(), "base", &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Refused, "a second snapshot of one name: {e}");
    let snaps_dir = root.path().join("snapshots").join("namespace");
    assert_eq!(
        std::fs::read_dir(&snaps_dir).unwrap().count(),
        1,
        "the refused one left nothing behind"
    );
    let listed = provider(root.path()).snapshots(&ctx).await.unwrap();
    assert_eq!(listed, vec![s.clone()]);
    // Changes after the snapshot are not in it.
    assert_eq!(sh(b.as_ref(), "echo later > /workspace/later").await.0, 0);
    b.destroy(&ctx).await.unwrap();

    let spec = Spec {
        snapshot: Some("base".into()),
        ..Spec::new(Duration::from_secs(120))
    };
    let c = p.create(&spec, &ctx).await.unwrap();
    assert_eq!(c.facts().snapshot.as_deref(), Some("base"));
    let (code, out) = sh(c.as_ref(), "cat /workspace/w /root/h; /workspace/x; ls /workspace; ls -A /tmp; echo more >> /workspace/w; cat /workspace/w").await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "w\nh\nran\nw\nx\nw\nmore\n",
        "its files, executable and the box's own; not tmp"
    );
    // The snapshot is not changed by the box made from it.
    assert_eq!(std::fs::read_to_string(snaps_dir.join("base/work/w")).unwrap(), "w\n");
    // A named box may start from it too.
    let named = p.open("from-base", &spec, &ctx).await.unwrap();
    assert_eq!(sh(named.as_ref(), "cat /workspace/w").await.1, "w\n");

    let missing = Spec {
        snapshot: Some("nope".into()),
        ..Spec::new(Duration::from_secs(60))
    };
    let e = p.create(&missing, &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    assert!(e.message().contains("\"nope\""), "{e}");

    assert!(p.delete_snapshot("base", &ctx).await.unwrap());
    assert!(!p.delete_snapshot("base", &ctx).await.unwrap());
    assert!(p.snapshots(&ctx).await.unwrap().is_empty());
    assert_eq!(
        sh(c.as_ref(), "cat /workspace/w").await.1,
        "w\nmore\n",
        "its boxes are not touched"
    );
    c.destroy(&ctx).await.unwrap();
    named.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_of_one_name_answer_one_box_and_a_discard_empties_it() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background();
    let spec = Spec {
        labels: labels(&[("team", "a")]),
        ..Spec::new(Duration::from_secs(120))
    };
    let mut opens = Vec::new();
    for _ in 0..4 {
        let (path, spec) = (root.path().to_path_buf(), spec.clone());
        opens.push(tokio::spawn(async move {
            provider(&path).open("dev", &spec, &Ctx::background()).await
        }));
    }
    let mut ids = Vec::new();
    for o in opens {
        ids.push(o.await.unwrap().unwrap().id().clone());
    }
    assert!(ids.iter().all(|i| i == &ids[0]), "one box: {ids:?}");
    let p = provider(root.path());
    let b = p.open("dev", &spec, &ctx).await.unwrap();
    assert_eq!(b.id(), &ids[0]);
    assert_eq!(b.facts().name.as_deref(), Some("dev"));
    assert_eq!(p.list(&Labels::new(), &ctx).await.unwrap().len(), 1);
    assert_eq!(sh(b.as_ref(), "echo mine > /workspace/m").await.0, 0);

    // Other labels are another box; a bad name is refused.
    let other = p.open("dev", &Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    assert_ne!(other.id(), b.id());
    let e = p.open("Dev!", &spec, &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().starts_with("open: name: "), "{e}");
    // A named box's labels are part of its name.
    let e = p.relabel(b.id(), &labels(&[("team", "b")]), &ctx).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");

    // A sleeping one is woken by its open.
    p.sleep(b.id(), &ctx).await.unwrap();
    let again = p.open("dev", &spec, &ctx).await.unwrap();
    assert_eq!(again.id(), b.id());
    assert_eq!(sh(again.as_ref(), "cat /workspace/m").await, (0, "mine\n".into()));

    assert!(p.discard("dev", &spec.labels, &ctx).await.unwrap());
    assert!(
        !p.discard("dev", &spec.labels, &ctx).await.unwrap(),
        "none the second time"
    );
    let fresh = p.open("dev", &spec, &ctx).await.unwrap();
    assert_eq!(fresh.id(), b.id(), "the same name's place");
    assert_eq!(
        sh(fresh.as_ref(), "ls -A /workspace").await,
        (0, String::new()),
        "empty"
    );
    assert!(p.discard("dev", &Labels::new(), &ctx).await.unwrap());
    fresh.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_refuses_a_box_of_another_name_and_makes_an_ended_one_again() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let v = view(root.path());
    let ctx = Ctx::background();
    let b = p.open("short", &Spec::new(Duration::from_secs(2)), &ctx).await.unwrap();
    let first_start = b.facts().started_at_ms;
    assert!(ended_within(&v, b.id(), Duration::from_secs(5)).await);
    let c = p
        .open("short", &Spec::new(Duration::from_secs(60)), &ctx)
        .await
        .unwrap();
    assert_eq!(c.id(), b.id());
    assert_ne!(c.facts().started_at_ms, first_start, "made again");
    assert_eq!(c.status(&ctx).await.unwrap(), Status::Running);
    // A record at the name's place that carries another name is not this name's box.
    let path = v.boxes.join(c.id().name()).join("record.json");
    let mut rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    rec["name"] = "someone-else".into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let e = p
        .open("short", &Spec::new(Duration::from_secs(60)), &ctx)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    assert!(e.message().starts_with("open "), "{e}");
    c.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabel_replaces_the_labels_and_concurrent_changes_keep_each_other() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let b = p
        .create(
            &Spec {
                labels: labels(&[("a", "1")]),
                ..Spec::new(Duration::from_secs(120))
            },
            &ctx,
        )
        .await
        .unwrap();
    let r = p.relabel(b.id(), &labels(&[("b", "2")]), &ctx).await.unwrap();
    assert_eq!(r.labels(), &labels(&[("b", "2")]));
    let fresh = provider(root.path());
    assert_eq!(fresh.list(&labels(&[("b", "2")]), &ctx).await.unwrap().len(), 1);
    assert!(fresh.list(&labels(&[("a", "1")]), &ctx).await.unwrap().is_empty());
    let e = p
        .relabel(b.id(), &labels(&[("agentbox.x", "y")]), &ctx)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");

    // Extends and relabels at once, from providers of their own: the last of each stands,
    // and neither is lost to the other.
    let base = now_ms() + 60_000;
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let (path, id) = (root.path().to_path_buf(), b.id().clone());
        tasks.push(tokio::spawn(async move {
            let p = provider(&path);
            let ctx = Ctx::background();
            if i % 2 == 0 {
                p.extend(&id, base + i * 1_000, &ctx).await.map(|_| ())
            } else {
                p.relabel(&id, &labels(&[("n", &i.to_string()), ("kept", "yes")]), &ctx)
                    .await
                    .map(|_| ())
            }
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let now = fresh.attach(b.id(), &ctx).await.unwrap().unwrap();
    let end = now.facts().ends_at_ms.unwrap();
    assert!([base, base + 2_000, base + 4_000].contains(&end), "{end}");
    assert_eq!(
        now.labels().get("kept").map(String::as_str),
        Some("yes"),
        "{:?}",
        now.labels()
    );
    b.destroy(&ctx).await.unwrap();
}

/// One request to a box's control socket from a process of the host's (python, so that it
/// can be run inside the box's pid namespace by nsenter); what the init answered.
fn control(socket: &std::path::Path, request: &str, in_box_of: Option<u32>) -> String {
    const SCRIPT: &str = "import socket,struct,sys\n\
        s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
        b=sys.argv[2].encode(); s.sendall(struct.pack('>I',len(b))+b)\n\
        n=struct.unpack('>I',s.recv(4))[0]; print(s.recv(n).decode())\n";
    let mut c = match in_box_of {
        Some(pid) => {
            let mut c = std::process::Command::new("nsenter");
            c.args(["-t", &pid.to_string(), "-p", "--", "/usr/bin/python3"]);
            c
        }
        None => std::process::Command::new("/usr/bin/python3"),
    };
    let out = c.args(["-c", SCRIPT]).arg(socket).arg(request).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_init_takes_no_request_from_a_process_of_the_box() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("NOT RUN: only root can enter a box's pid namespace to play a program of it (CI runs this as root)");
        assert!(std::env::var_os("CI").is_none(), "CI runs this test as root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let v = view(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(3)), &ctx).await.unwrap();
    let dir = v.boxes.join(b.id().name());
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("record.json")).unwrap()).unwrap();
    let init = record["init_pid"].as_u64().unwrap() as u32;
    let socket = dir.join(agentbox_protocol::namespace::CONTROL);
    // The host's process is answered; one in the box's pid namespace is refused, even with the
    // socket's path in hand (a box has no path to it: it is not in the box's mount tree).
    assert_eq!(control(&socket, r#"{"op":"ping"}"#, None).trim(), r#"{"reply":"ok"}"#);
    let later = format!(r#"{{"op":"deadline","deadline_ms":{}}}"#, now_ms() + 600_000);
    let said = control(&socket, &later, Some(init));
    assert!(said.contains(r#""code":"refused""#), "{said}");
    let said = control(&socket, r#"{"op":"sleep"}"#, Some(init));
    assert!(said.contains(r#""code":"refused""#), "{said}");
    assert_eq!(sh(b.as_ref(), "echo awake").await.1, "awake\n", "not put to sleep");
    // The box still ends at its own deadline.
    assert!(ended_within(&v, b.id(), Duration::from_secs(6)).await, "not extended");
    // And no path inside the box names the control socket.
    let c = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let (_, found) = sh(
        c.as_ref(),
        "for d in / /run /run/agentbox /workspace /root /tmp; do ls -A $d; done | grep -c control.sock || true",
    )
    .await;
    assert_eq!(found, "0\n");
    c.destroy(&ctx).await.unwrap();
}
