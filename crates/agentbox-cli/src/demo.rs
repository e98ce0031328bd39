//! `agentbox demo`: the contract on local boxes, with nothing to set up.

use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Result, Spec, finish};

pub async fn run() -> Result<()> {
    let provider = crate::boxes::provider("local").await?;
    let ctx = Ctx::background();
    let spec = Spec::new(Duration::from_secs(120))
        .label("agentbox-demo", "1")
        .env("GREETING", "hello from the box");
    let b = provider.create(&spec, &ctx).await?;
    println!(
        "made {} (it ends by itself in 2 minutes, whatever happens to this process)",
        b.id()
    );
    for script in [
        "echo \"$GREETING\"; echo \"HOME=$HOME\"",
        "env | cut -d= -f1 | sort | tr '\\n' ' '; echo",
        "sleep 300 >/dev/null 2>&1 & echo \"started a background program, pid $!\"",
    ] {
        let argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
        let out = finish(
            b.exec(&argv, &ExecOptions::default(), &ctx).await?,
            FinishOptions::default(),
        )
        .await?;
        println!("$ {script}\n{}", out.stdout_text().trim_end());
    }
    b.destroy(&ctx).await?;
    println!(
        "destroyed {}: the box's directory and every program in it are gone",
        b.id()
    );
    Ok(())
}
