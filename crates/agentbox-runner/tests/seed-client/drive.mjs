// Drives the seed's own client against a runner at process.argv[2] (http://host:port) and
// prints what each call gave, as one JSON object, for the Rust test to check.
import { runnerBox, runnerHealth } from "./runner-box.mjs";

const url = process.argv[2];
const box = runnerBox({ url, id: "seed-client" });
const text = async (stream) => new TextDecoder().decode(await new Response(stream).arrayBuffer());
const out = {};

out.health = await runnerHealth(url);

let p = await box.run("echo out; echo err >&2; exit 3");
const [o, e, x] = await Promise.all([text(p.stdout), text(p.stderr), p.wait()]);
out.run = { stdout: o, stderr: e, exitCode: x.exitCode };

p = await box.run("tr a-z A-Z", { stdin: true, env: { X: "1" } });
const w = p.stdin.getWriter();
await w.write(new TextEncoder().encode("piped through\n"));
await w.close();
out.stdin = { stdout: await text(p.stdout), exitCode: (await p.wait()).exitCode };

p = await box.run("sleep 30");
setTimeout(() => p.kill("SIGTERM"), 200);
out.kill = (await p.wait()).exitCode;

const ac = new AbortController();
p = await box.run("sleep 30", { signal: ac.signal });
setTimeout(() => ac.abort(), 200);
out.abort = (await p.wait()).exitCode;

p = await box.run("true", { cwd: "no/such/dir" });
out.badCwd = { exitCode: (await p.wait()).exitCode, stderr: await text(p.stderr) };

await box.write("seed/file.bin", new Uint8Array([0, 1, 2, 255]), { mode: 0o600 });
out.read = Array.from(await box.read("seed/file.bin"));
out.readMissing = await box.read("seed/nothing");

p = await box.run("sleep 30");
const killed = p.wait();
await box.stop();
out.stop = (await killed).exitCode;

// After a stop, the next call connects again.
p = await box.run("echo again");
out.after = { stdout: await text(p.stdout), exitCode: (await p.wait()).exitCode };
await box.stop();

console.log(JSON.stringify(out));
process.exit(0);
