//! Archil exec boxes against the real Archil: the conformance suite, only where
//! `ARCHIL_API_KEY` is set (with `ARCHIL_REGION`, else `aws-us-east-1`, or `ARCHIL_BASE_URL`;
//! see docs/archil.md). Without a key it says loudly that it did not run; CI has no key and runs
//! the fake's suite (`tests/archil.rs`). It makes a disk of its own, runs the suite on it,
//! deletes it and checks that none is left. Each exec is a paid call.

#![cfg(feature = "archil")]

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Provider;
use agentbox_providers::archil::{ArchilOptions, ArchilProvider};
use agentbox_testing::conformance::{self, Options};
use serde_json::Value;

#[path = "common/archil_view.rs"]
mod archil_view;
use archil_view::View;

/// The control plane, spoken directly for what the provider never does: make and delete disks.
struct Control {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Control {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("Authorization", format!("key-{}", self.key.trim_start_matches("key-")))
            .timeout(Duration::from_secs(60));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("Archil answers");
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success() && v["success"] == true, "{path}: {status} {v}");
        v
    }
}

/// Deletes the suite's disk when dropped, so a panic anywhere after it was made (a case, an
/// assertion, a factory) leaves no paid disk behind.
struct DiskGuard {
    base: String,
    key: String,
    disk: String,
}

impl Drop for DiskGuard {
    fn drop(&mut self) {
        let (base, key, disk) = (self.base.clone(), self.key.clone(), self.disk.clone());
        // A thread of its own with its own runtime: drop may run inside the test's runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let answer = rt.block_on(async {
                reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .delete(format!("{base}/api/disks/{disk}"))
                    .header("Authorization", format!("key-{}", key.trim_start_matches("key-")))
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .map(|r| r.status().to_string())
                    .unwrap_or_else(|e| e.to_string())
            });
            eprintln!("archil live suite: deleting disk {disk}: {answer}");
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archil_boxes_on_the_real_archil_pass_the_conformance_suite() {
    let Ok(key) = std::env::var("ARCHIL_API_KEY") else {
        eprintln!(
            "\n!!!! archil_boxes_on_the_real_archil_pass_the_conformance_suite: ARCHIL_API_KEY unset: this test did \
             NOT run (it needs an Archil account; see docs/archil.md) !!!!\n"
        );
        return;
    };
    let mut opts = ArchilOptions::from_vars(|k| match k {
        "ARCHIL_REGION" => std::env::var(k).ok().or_else(|| Some("aws-us-east-1".into())),
        _ => std::env::var(k).ok().filter(|v| !v.is_empty()),
    })
    .expect("the Archil variables read");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let control = Control {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        base: opts.base_url.trim_end_matches('/').to_string(),
        key: key.clone(),
    };
    let name = format!("agentbox-live-{}", std::process::id());
    let made = control
        .call(
            reqwest::Method::POST,
            "/api/disks",
            Some(serde_json::json!({ "name": name })),
        )
        .await;
    let disk = made["data"]["diskId"].as_str().expect("a disk id").to_string();
    let guard = DiskGuard {
        base: control.base.clone(),
        key: key.clone(),
        disk: disk.clone(),
    };
    // A new disk takes a while to be available.
    let t = std::time::Instant::now();
    loop {
        let d = control
            .call(reqwest::Method::GET, &format!("/api/disks/{disk}"), None)
            .await;
        if d["data"]["status"] == "available" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "disk {disk} not available after 300 s: {d}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    opts.disk = Some(disk.clone());
    let view = View::new(&opts.s3_base_url, &disk, &key);
    let mut options = Options::new(
        "archil-live",
        Duration::from_secs(20),
        Duration::from_secs(60),
        Arc::new(view),
    );
    options.without_live_processes =
        Some("each command is one Archil exec call; no program runs between calls, and it takes no input".into());
    options.without_env = Some("Archil's exec carries only the command".into());
    let make = opts.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let o = make.clone();
            async move { Arc::new(ArchilProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        options,
    )
    .await;
    // Whatever the report, delete the disk and check that it is gone.
    drop(guard);
    let listed = control
        .call(reqwest::Method::GET, &format!("/api/disks?name={name}"), None)
        .await;
    let left: Vec<&Value> = listed["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|d| d["id"] == disk.as_str() && d["status"] != "deleting" && d["status"] != "deleted")
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "the suite's disk is left: {left:?}");
    report.assert_all_passed();
}
