//! What the hands' tests share: a local box whose runner speaks protocol 2 alone.

use std::sync::Arc;

use agentbox_core::{Ctx, Provider, Sandbox, Spec};
use agentbox_providers::{LocalOptions, LocalProvider};

/// A local box through a runner of protocol 2 alone (the seed's, which refuses `hello`):
/// hands goes by its exec for what that protocol has no message for.
pub(crate) async fn protocol_2_box(home: &std::path::Path, spec: &Spec) -> Arc<dyn Sandbox> {
    let ctx = Ctx::background();
    let mut bare = LocalOptions::at(home).unwrap();
    bare.runner = false;
    let inner = LocalProvider::new(bare).unwrap().create(spec, &ctx).await.unwrap();
    let sock = home.join("boxes").join(inner.id().name()).join("p2.sock");
    let argv: Vec<String> = [
        agentbox_testing::runner::ensure().to_string_lossy().into_owned(),
        "serve".into(),
        "--protocol".into(),
        "2".into(),
        "--listen".into(),
        format!("unix:{}", sock.display()),
        "--detach".into(),
    ]
    .to_vec();
    let p = inner
        .exec(&argv, &agentbox_core::ExecOptions::default(), &ctx)
        .await
        .unwrap();
    let started = agentbox_core::finish(p, Default::default()).await.unwrap();
    assert_eq!(started.status.code, 0, "{}", started.stderr_text());
    let b = agentbox_providers::runner::RunnerSandbox::new(
        inner,
        Arc::new(agentbox_providers::runner::Address::Unix(sock)),
    );
    b.check(&ctx).await.unwrap();
    assert!(b.client().protocol_2_only());
    Arc::new(b)
}
