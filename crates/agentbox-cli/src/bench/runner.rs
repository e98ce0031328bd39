//! `agentbox bench runner`: exec, read and write through a box's runner beside one exec per
//! operation, and attaching to a process's kept output beside `exec tail -c`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Sandbox, Spec, finish};

use super::BenchArgs;
use super::measure::{Stats, measure, pair, print_pairs};

/// A box twice over: `plain`, whose every operation is an exec, and `through`, the same box
/// through its runner.
struct Twin {
    plain: Arc<dyn Sandbox>,
    through: Arc<dyn Sandbox>,
}

async fn twin(provider: &str, ctx: &Ctx) -> Result<Twin> {
    let spec = Spec::new(Duration::from_secs(900)).label("agentbox-bench", "1");
    let without = agentbox_providers::registry::Options {
        runner: false,
        ..Default::default()
    };
    if provider == "docker" {
        let through = crate::boxes::provider("docker").await?.create(&spec, ctx).await?;
        if through.facts().runner.is_none() {
            let _ = through.destroy(ctx).await;
            return Err(Error::unsupported(
                "the Docker box got no runner (see the warning above)",
            ));
        }
        let plain = crate::boxes::provider_with("docker", &without)
            .await?
            .attach(through.id(), ctx)
            .await?
            .ok_or_else(|| Error::gone("the bench's Docker box ended"))?;
        return Ok(Twin { plain, through });
    }
    let plain = crate::boxes::provider_with(provider, &without)
        .await?
        .create(&spec, ctx)
        .await?;
    let sock = agentbox_providers::home::default_home()?
        .join("boxes")
        .join(plain.id().name())
        .join("bench-runner.sock");
    let helper = crate::boxes::environment()?.runner()?;
    let mut program = vec![helper.program.to_string_lossy().into_owned()];
    program.extend(helper.args);
    agentbox_providers::runner::start(
        plain.as_ref(),
        &program,
        &[format!("unix:{}", sock.display())],
        None,
        ctx,
    )
    .await?;
    let through: Arc<dyn Sandbox> = Arc::new(agentbox_providers::runner::RunnerSandbox::new(
        plain.clone(),
        Arc::new(agentbox_providers::runner::Address::Unix(sock)),
    ));
    Ok(Twin { plain, through })
}

/// One exec of `argv` with `stdin`, required to exit 0; its stdout.
async fn exec_ok(b: &dyn Sandbox, argv: &[&str], stdin: &[u8]) -> Result<Vec<u8>> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let p = b.exec(&argv, &ExecOptions::default(), &ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin: stdin.to_vec(),
            ..Default::default()
        },
    )
    .await?;
    if !out.status.success() {
        return Err(Error::unknown(format!(
            "{argv:?} exited {}: {}",
            out.status.code,
            out.stderr_text()
        )));
    }
    Ok(out.stdout)
}

fn file_err(e: agentbox_core::FileError) -> Error {
    match e {
        agentbox_core::FileError::Box(e) => e,
        agentbox_core::FileError::Os(n) => Error::io(std::io::Error::from_raw_os_error(n), "a file operation"),
    }
}

/// Exec, read and write through the runner vs one exec per operation, on local and Docker
/// boxes: the same box on both sides, interleaved sample by sample.
pub(super) async fn runner(args: BenchArgs) -> Result<()> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(900));
    let n = args.iterations;
    let mut pairs = Vec::new();
    let mut notes = Vec::new();
    eprintln!("agentbox bench runner: {n} samples of each side, interleaved");
    for provider in ["local", "docker"] {
        let t = match twin(provider, &ctx).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("agentbox bench runner: no {provider} box ({e}); measuring without it");
                continue;
            }
        };
        let block = vec![b'r'; 4096];
        let files = t
            .through
            .files()
            .ok_or_else(|| Error::unknown("the runner box serves no files"))?;
        files
            .write("bench/4k.bin", &block, false, &ctx)
            .await
            .map_err(file_err)?;
        let measured = async {
            let (a, b) = measure(
                n,
                || async { exec_ok(&*t.plain, &["true"], b"").await.map(|_| ()) },
                || async { exec_ok(&*t.through, &["true"], b"").await.map(|_| ()) },
            )
            .await?;
            pairs.push(pair(
                "exec round trip of true",
                "one exec",
                &format!("{provider} box's runner"),
                a,
                b,
            ));
            let (a, b) = measure(
                n,
                || async {
                    let got = exec_ok(&*t.plain, &["cat", "bench/4k.bin"], b"").await?;
                    if got.len() == 4096 {
                        Ok(())
                    } else {
                        Err(Error::unknown("a short read"))
                    }
                },
                || async {
                    let got = files.read("bench/4k.bin", &Ctx::background()).await.map_err(file_err)?;
                    if got.is_some_and(|g| g.len() == 4096) {
                        Ok(())
                    } else {
                        Err(Error::unknown("a short read"))
                    }
                },
            )
            .await?;
            pairs.push(pair("read 4 KB", "exec cat", &format!("{provider} box's runner"), a, b));
            let (a, b) = measure(
                n,
                || async {
                    exec_ok(&*t.plain, &["sh", "-c", "cat > bench/w.bin"], &block)
                        .await
                        .map(|_| ())
                },
                || async {
                    files
                        .write("bench/w.bin", &block, false, &Ctx::background())
                        .await
                        .map_err(file_err)
                },
            )
            .await?;
            pairs.push(pair(
                "write 4 KB",
                "exec sh -c 'cat > f'",
                &format!("{provider} box's runner"),
                a,
                b,
            ));
            // A runner that keeps no processes (an older one in a Docker box) leaves this row
            // out, named under the table, rather than the rows above.
            match attach_and_read(n, &t, files, &ctx).await {
                Ok((a, b)) => pairs.push(pair(
                    "attach, read 32 KB from byte 32K",
                    "exec tail -c +32769 of the same 64 KB in a file",
                    &format!("{provider} box's runner: attach to an ended process at byte 32768, read to its end"),
                    a,
                    b,
                )),
                Err(e) => {
                    let note = format!("attach and read, {provider} box: {}", crate::one_line(e.message()));
                    eprintln!("agentbox bench runner: not measured: {note}");
                    notes.push(note);
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        let _ = t.through.destroy(&ctx).await;
        measured?;
    }
    print_pairs(&pairs, &notes, args.json)
}

/// The second half of a process's 64 KB output read again by attaching to it at byte 32768
/// (it ended: its output is kept by the runner) vs the same 32 KB of a file by one exec of
/// `tail -c`, the way to get bytes from an offset without a runner.
async fn attach_and_read(n: u32, t: &Twin, files: &dyn agentbox_core::Files, ctx: &Ctx) -> Result<(Stats, Stats)> {
    const FROM: u64 = 32 << 10;
    const ALL: usize = 64 << 10;
    files
        .write("bench/64k.bin", &vec![b'a'; ALL], false, ctx)
        .await
        .map_err(file_err)?;
    let ps = t
        .through
        .processes()
        .ok_or_else(|| Error::unknown("the runner box keeps no processes"))?;
    let argv = vec!["cat".to_string(), "bench/64k.bin".to_string()];
    let opts = ExecOptions {
        detach: true,
        ..Default::default()
    };
    let handle = t
        .through
        .exec(&argv, &opts, ctx)
        .await?
        .handle()
        .ok_or_else(|| Error::unknown("the detached cat got no handle"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = ps.list(ctx).await?;
        let p = listed
            .iter()
            .find(|p| p.handle == handle)
            .ok_or_else(|| Error::unknown("the detached cat is not listed"))?;
        if p.state != agentbox_core::ProcessState::Running && p.end == ALL as u64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::timeout("the detached cat did not end within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want = ALL - FROM as usize;
    let measured = measure(
        n,
        || async {
            let got = exec_ok(&*t.plain, &["tail", "-c", "+32769", "bench/64k.bin"], b"").await?;
            if got.len() == want {
                Ok(())
            } else {
                Err(Error::unknown(format!("tail -c read {} bytes, not {want}", got.len())))
            }
        },
        || async {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
            let mut p = ps.attach(handle, FROM, &ctx).await?;
            let got = agentbox_core::read_bounded(p.stdout.take(), ALL, "the attached output").await?;
            p.wait().await?;
            if got.len() == want {
                Ok(())
            } else {
                Err(Error::unknown(format!(
                    "the attach read {} bytes, not {want}",
                    got.len()
                )))
            }
        },
    )
    .await;
    let _ = ps.forget(handle, ctx).await;
    measured
}
