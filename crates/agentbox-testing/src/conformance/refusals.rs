//! The case of what a provider refuses: each refusal typed with its code, naming the field.

use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, Network, PortKind, PortSpec, Spec};

use super::CaseResult;
use super::cx::Cx;

/// A spec the provider cannot honour is refused `unsupported` and a malformed one `invalid`,
/// each naming the field, before anything is made.
pub(super) async fn typed_refusals(cx: &Cx) -> CaseResult {
    let honours = cx.provider.honours();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let expect = |spec: Spec, code: ErrorCode, field: &'static str| {
        let ctx = ctx.clone();
        async move {
            match cx.provider.create(&spec, &ctx).await {
                Err(e) if e.code() == code && e.message().contains(field) => Ok(()),
                Err(e) => Err(format!(
                    "a spec with {field} answered {e}, expected {code} naming {field}"
                )),
                Ok(_) => Err(format!("a spec with {field} made a box, expected {code}")),
            }
        }
    };
    let with = |f: &dyn Fn(&mut Spec)| {
        let mut s = cx.spec();
        f(&mut s);
        s
    };
    expect(
        with(&|s| s.max_lifetime = Duration::ZERO),
        ErrorCode::Invalid,
        "max_lifetime",
    )
    .await?;
    expect(
        with(&|s| drop(s.labels.insert("agentbox.mine".into(), "1".into()))),
        ErrorCode::Invalid,
        "labels",
    )
    .await?;
    expect(
        with(&|s| drop(s.env.insert("NOT-A-NAME".into(), "1".into()))),
        ErrorCode::Invalid,
        "env",
    )
    .await?;
    let u = ErrorCode::Unsupported;
    if !honours.snapshot {
        expect(with(&|s| s.snapshot = Some("snap".into())), u, "snapshot").await?;
    }
    if !honours.image {
        expect(with(&|s| s.image = Some("debian".into())), u, "image").await?;
    }
    if !honours.cpus {
        expect(with(&|s| s.cpus = Some(1.0)), u, "cpus").await?;
    }
    if !honours.memory {
        expect(with(&|s| s.memory_mb = Some(512)), u, "memory_mb").await?;
    }
    if !honours.gpu {
        expect(with(&|s| s.gpu = Some("T4".into())), u, "gpu").await?;
    }
    if !honours.region {
        expect(with(&|s| s.region = Some("eu-west".into())), u, "region").await?;
    }
    expect(
        with(&|s| s.isolation = Some("conformance-no-such-isolation".into())),
        u,
        "isolation",
    )
    .await?;
    if !honours.network_none {
        expect(with(&|s| s.network = Some(Network::None)), u, "network").await?;
    }
    if !honours.network_allowlist {
        expect(
            with(&|s| s.network = Some(Network::Allow(vec!["example.com".into()]))),
            u,
            "network",
        )
        .await?;
    }
    if !honours.ports {
        expect(
            with(&|s| {
                s.ports.push(PortSpec {
                    port: 8080,
                    kind: PortKind::Tcp,
                })
            }),
            u,
            "ports",
        )
        .await?;
    }
    if !honours.capabilities.iter().any(|c| c == "fuse") {
        expect(with(&|s| s.capabilities.push("fuse".into())), u, "capabilities").await?;
    }
    if !honours.mounts {
        let m = agentbox_core::Mount {
            source: "/tmp".into(),
            target: "/mnt/x".into(),
            read_only: true,
        };
        expect(with(&|s| s.mounts.push(m.clone())), u, "mounts").await?;
    }
    if !honours.workspace {
        expect(with(&|s| s.workspace = Some("/workspace".into())), u, "workspace").await?;
    }
    // Argv is checked too.
    let b = cx.new_box().await?;
    match b.exec(&[], &ExecOptions::default(), &Ctx::background()).await {
        Err(e) if e.code() == ErrorCode::Invalid => Ok(()),
        Err(e) => Err(format!("an empty argv answered {e}, expected invalid")),
        Ok(_) => Err("an empty argv started a program".into()),
    }
}
