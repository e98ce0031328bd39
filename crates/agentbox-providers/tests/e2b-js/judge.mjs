// The judge of agentbox's E2B API in JavaScript: E2B's own npm SDK (`e2b`, pinned in
// package.json), which nobody here wrote, drives it and asserts each answer. The twin of
// ../e2b_judge.py, with the same steps and modes (`JUDGE_MODE`):
//
// - `fake`: the fake E2B, run by tests/e2b.rs of the providers (its `judged` module);
// - `serve`: `agentbox serve --e2b`, run by tests/e2b_api.rs of the CLI, with two of its keys.
//
// The runner sets E2B_API_URL and E2B_SANDBOX_URL (both the one url), E2B_API_KEY,
// JUDGE_LIST_PAGE, JUDGE_MAX_TIMEOUT (seconds); for `serve`, AGENTBOX_URL and JUDGE_OTHER_KEY,
// and JUDGE_LACKS, the steps the provider under the server cannot take (asserted refused).
// Each step prints `OK <step>`; in `fake` mode `VANISH <id>` asks the runner to make a sandbox
// vanish; in `serve` mode the judge ends that sandbox's box itself, through the service's API.

import {
  AuthenticationError,
  CommandExitError,
  NotFoundError,
  Sandbox,
} from "e2b";

function ok(step) {
  console.log(`OK ${step}`);
}

function check(cond, what) {
  if (!cond) throw new Error(`judge: ${what}`);
}

async function refused(f, kind, what) {
  try {
    await f();
  } catch (e) {
    check(e instanceof kind, `${what}: ${e?.constructor?.name}: ${e?.message}`);
    return e;
  }
  throw new Error(`judge: ${what}: nothing was refused`);
}

const env = process.env;
const LIST_PAGE = Number(env.JUDGE_LIST_PAGE);
const MAX_TIMEOUT = Number(env.JUDGE_MAX_TIMEOUT);
const MODE = env.JUDGE_MODE;
check(MODE === "fake" || MODE === "serve", `JUDGE_MODE ${MODE}: fake or serve`);
const TAG = { judge: "e2b-js", run: String(process.pid) };

/** The service's own boxes labelled with an E2B sandbox's id, as `key` sees them. */
async function boxesOf(sandboxId, key) {
  const url = new URL("/v1/boxes", env.AGENTBOX_URL);
  url.searchParams.set("labels", `agentbox-server.e2b=${sandboxId}`);
  const r = await fetch(url, {
    headers: { authorization: `Bearer ${key}` },
    signal: AbortSignal.timeout(30_000),
  });
  check(r.ok, `GET ${url}: ${r.status}`);
  return (await r.json()).map((b) => b.id);
}

/** The service's own view of a sandbox's one box. */
async function boxInfo(sandboxId) {
  const boxes = await boxesOf(sandboxId, env.E2B_API_KEY);
  check(boxes.length === 1, `${sandboxId}: ${boxes}`);
  const r = await fetch(new URL(`/v1/boxes/${boxes[0]}`, env.AGENTBOX_URL), {
    headers: { authorization: `Bearer ${env.E2B_API_KEY}` },
    signal: AbortSignal.timeout(30_000),
  });
  check(r.ok, `GET ${boxes[0]}: ${r.status}`);
  return r.json();
}

/** End a sandbox's box through the service's own API, not E2B's. */
async function endElsewhere(sandboxId) {
  for (const box of await boxesOf(sandboxId, env.E2B_API_KEY)) {
    const r = await fetch(new URL(`/v1/boxes/${box}`, env.AGENTBOX_URL), {
      method: "DELETE",
      headers: { authorization: `Bearer ${env.E2B_API_KEY}` },
      signal: AbortSignal.timeout(30_000),
    });
    check(r.ok, `DELETE ${box}: ${r.status}`);
  }
}

const sbx = await Sandbox.create("base", {
  timeoutMs: 120_000,
  metadata: TAG,
  envs: { SBX_VAR: "from-sandbox" },
  allowInternetAccess: false,
});
check(sbx.sandboxId.length === 20, `sandbox id ${sbx.sandboxId}`);
check(await sbx.isRunning(), "a new sandbox runs");
ok("create");

const exit3 = await refused(
  () => sbx.commands.run("echo out; echo err >&2; exit 3"),
  CommandExitError,
  "exit 3",
);
check(exit3.exitCode === 3, `exit code ${exit3.exitCode}`);
check(exit3.stdout === "out\n", `stdout ${JSON.stringify(exit3.stdout)}`);
check(exit3.stderr === "err\n", `stderr ${JSON.stringify(exit3.stderr)}`);
let r = await sbx.commands.run("echo fine");
check(r.exitCode === 0 && r.stdout === "fine\n", `a fine command: ${JSON.stringify(r)}`);
const seen = [];
await sbx.commands.run("echo a; echo b", { onStdout: (d) => seen.push(d) });
check(seen.join("") === "a\nb\n", `streamed stdout ${JSON.stringify(seen)}`);
ok("run");

r = await sbx.commands.run('printf "%s %s" "$SBX_VAR" "$CMD_VAR"', { envs: { CMD_VAR: "mine" } });
check(r.stdout === "from-sandbox mine", `envs: ${JSON.stringify(r.stdout)}`);
r = await sbx.commands.run('printf "%s %s %s" "$E2B_SANDBOX" "$E2B_SANDBOX_ID" "$E2B_TEMPLATE_ID"');
check(r.stdout === `true ${sbx.sandboxId} base`, `envd's variables: ${JSON.stringify(r.stdout)}`);
r = await sbx.commands.run("pwd", { cwd: "/tmp", user: "root" });
check(r.stdout === "/tmp\n", `cwd: ${JSON.stringify(r.stdout)}`);
ok("envs");

r = await sbx.commands.run("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '");
check(r.stdout.split(/\s+/).filter(Boolean).join(",") === "lo", `interfaces: ${JSON.stringify(r.stdout)}`);
ok("no-internet");

let h = await sbx.commands.run("sleep 2; echo done", { background: true });
check(h.pid > 0, `pid ${h.pid}`);
const again = await sbx.commands.connect(h.pid);
let res = await again.wait();
check(res.stdout === "done\n", `reattached output ${JSON.stringify(res.stdout)}`);
ok("connect");

h = await sbx.commands.run("read line; echo got:$line", { background: true, stdin: true });
await sbx.commands.sendStdin(h.pid, "hello\n");
res = await h.wait();
check(res.stdout === "got:hello\n", `stdin: ${JSON.stringify(res.stdout)}`);
h = await sbx.commands.run("cat", { background: true, stdin: true });
await sbx.commands.sendStdin(h.pid, new TextEncoder().encode("bytes\n"));
await sbx.commands.closeStdin(h.pid);
res = await h.wait();
check(res.stdout === "bytes\n", `closeStdin: ${JSON.stringify(res.stdout)}`);
ok("stdin");

h = await sbx.commands.run("sleep 60", { background: true });
const listed = await sbx.commands.list();
const mine = listed.filter((p) => p.pid === h.pid);
check(mine.length === 1, `list: ${JSON.stringify(listed)}`);
check(mine[0].args.at(-1) === "sleep 60", `listed: ${JSON.stringify(mine[0])}`);
ok("list");

check(await sbx.commands.kill(h.pid), "kill a running one");
const killed = await refused(() => h.wait(), CommandExitError, "a killed command");
check(killed.exitCode === -1, `killed: exit ${killed.exitCode}`);
check(!(await sbx.commands.kill(h.pid)), "kill a gone one");
ok("kill");

// A terminal: its size as asked, then as resized, its exit code, its output as pty data.
const enc = new TextEncoder();
let seenPty = [];
let t = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => seenPty.push(Buffer.from(d)) });
await sbx.pty.sendInput(t.pid, enc.encode("stty size; exit 5\n"));
const ptyExit = await refused(() => t.wait(), CommandExitError, "a terminal's exit 5");
check(ptyExit.exitCode === 5, `the terminal's exit ${ptyExit.exitCode}`);
check(Buffer.concat(seenPty).toString().includes("24 80"), `the terminal's size: ${Buffer.concat(seenPty)}`);
seenPty = [];
t = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => seenPty.push(Buffer.from(d)) });
await sbx.pty.resize(t.pid, { rows: 30, cols: 100 });
await sbx.pty.sendInput(t.pid, enc.encode("stty size; exit\n"));
await t.wait();
check(Buffer.concat(seenPty).toString().includes("30 100"), `the resized terminal: ${Buffer.concat(seenPty)}`);
t = await sbx.pty.create({ rows: 24, cols: 80, onData: () => {} });
check(await sbx.pty.kill(t.pid), "kill a terminal");
ok("pty");

const data = new Uint8Array(256 * 1024).map((_, i) => i % 256);
await sbx.files.write("/tmp/f", data.buffer);
const got = await sbx.files.read("/tmp/f", { format: "bytes" });
check(Buffer.from(got).equals(Buffer.from(data)), `read back ${got.length} bytes`);
// gzip both ways: the upload's body, the download's answer.
await sbx.files.write("/tmp/z", data.buffer, { gzip: true });
const unzipped = await sbx.files.read("/tmp/z", { format: "bytes", gzip: true });
check(Buffer.from(unzipped).equals(Buffer.from(data)), `gzip both ways: ${unzipped.length} bytes`);
const info = await sbx.files.write("/tmp/deep/er/t.txt", "text");
check(info.path === "/tmp/deep/er/t.txt", `write info ${JSON.stringify(info)}`);
check((await sbx.files.read("/tmp/deep/er/t.txt")) === "text", "text read");
await sbx.files.write("rel.txt", "relative");
check((await sbx.commands.run("cat rel.txt")).stdout === "relative", "a relative file seen by a command");
await sbx.commands.run("echo made > made.txt");
check((await sbx.files.read("made.txt")) === "made\n", "a command's file read by a relative path");
ok("files-rw");

check(await sbx.files.makeDir("/tmp/d"), "makeDir");
check(!(await sbx.files.makeDir("/tmp/d")), "makeDir again");
await sbx.files.write("/tmp/d/a", "a");
const entries = await sbx.files.list("/tmp/d");
check(entries.map((e) => e.name).join(",") === "a", `list ${JSON.stringify(entries)}`);
check(entries[0].size === 1, `size ${entries[0].size}`);
const moved = await sbx.files.rename("/tmp/d/a", "/tmp/d/b");
check(moved.path === "/tmp/d/b", `rename ${JSON.stringify(moved)}`);
check((await sbx.files.exists("/tmp/d/b")) && !(await sbx.files.exists("/tmp/d/a")), "exists");
// As envd lists: depth first, each directory's entries in byte order, each followed by its own.
for (const p of ["/tmp/o/b", "/tmp/o/a-b", "/tmp/o/a/y", "/tmp/o/a/x"]) await sbx.files.write(p, "o");
const order = (await sbx.files.list("/tmp/o", { depth: 2 })).map((e) => e.path);
check(order.join(",") === "/tmp/o/a,/tmp/o/a/x,/tmp/o/a/y,/tmp/o/a-b,/tmp/o/b", `list order: ${order}`);
await sbx.commands.run("ln -s /tmp/o/a /tmp/o/link && ln -s /tmp/o/none /tmp/o/broken");
const link = await sbx.files.getInfo("/tmp/o/link");
check(link.type === "dir" && link.symlinkTarget === "/tmp/o/a", `a link to a dir: ${JSON.stringify(link)}`);
check(link.permissions.startsWith("L"), `its permissions: ${link.permissions}`);
check((await sbx.files.getInfo("/tmp/o/broken")).symlinkTarget === "/tmp/o/broken", "a broken link's target");
await sbx.files.remove("/tmp/o");
await sbx.files.remove("/tmp/o"); // a missing path: no error, as envd's
const gi = await sbx.files.getInfo("/tmp/d");
check(gi.type === "dir", `getInfo ${JSON.stringify(gi)}`);
await sbx.files.remove("/tmp/d");
check(!(await sbx.files.exists("/tmp/d")), "removed");
await refused(() => sbx.files.read("/tmp/nope"), NotFoundError, "a missing file");
ok("files-ops");

// A watched directory: its events, down the tree, as they come.
await sbx.files.makeDir("/tmp/w/sub");
const events = new Set();
const w = await sbx.files.watchDir("/tmp/w", (e) => events.add(`${e.name} ${e.type}`), { recursive: true });
/** Wait until `want` ("name type") was seen, within 15 s. */
async function watched(want) {
  for (let waited = 0; waited < 15_000 && !events.has(want); waited += 100) {
    await new Promise((r) => setTimeout(r, 100));
  }
  check(events.has(want), `watch: no ${want} in ${[...events]}`);
}
await sbx.files.write("/tmp/w/a", "1");
await watched("a create");
await sbx.files.write("/tmp/w/sub/b", "2");
await watched("sub/b create");
await sbx.files.remove("/tmp/w/sub/b");
await watched("sub/b remove");
await sbx.files.write("/tmp/w/a", "22");
await watched("a write");
check(events.size === 4, `watch events beyond the steps: ${[...events]}`);
await w.stop();
await refused(() => sbx.files.watchDir("/tmp/nope", () => {}), NotFoundError, "watch a missing dir");
ok("watch");

await sbx.setTimeout(600_000);
const left = ((await sbx.getInfo()).endAt.getTime() - Date.now()) / 1000;
check(570 < left && left <= 601, `end after setTimeout: ${left}`);
const detail = await Sandbox.getInfo(sbx.sandboxId);
check(detail.state === "running", `state ${detail.state}`);
check(JSON.stringify(detail.metadata) === JSON.stringify(TAG), `metadata ${JSON.stringify(detail.metadata)}`);
ok("timeout");

// Metrics, measured in the box: a sample now, and the ones kept since.
const first = await sbx.getMetrics();
check(first.length >= 1, `metrics: ${JSON.stringify(first)}`);
const m = first[first.length - 1];
check(m.cpuCount >= 1 && m.cpuUsedPct >= 0, `the CPUs: ${JSON.stringify(m)}`);
check(m.memUsed > 0 && m.memUsed <= m.memTotal, `the memory: ${JSON.stringify(m)}`);
check(m.diskUsed > 0 && m.diskUsed <= m.diskTotal, `the disk: ${JSON.stringify(m)}`);
const kept = await sbx.getMetrics({ start: m.timestamp });
check(kept.length >= 2 && kept[0].timestamp >= m.timestamp, `the samples kept: ${JSON.stringify(kept)}`);
ok("metrics");

// What is not served answers as a feature E2B lacks, never as a sandbox not found.
const unserved = await refused(() => sbx.updateNetwork({ allowOut: ["example.com"] }), Error, "a network update");
check(!(unserved instanceof NotFoundError) && /501/.test(unserved.message), `a network update: ${unserved.message}`);
check(await sbx.isRunning(), "running after a route it lacks");
ok("unserved");

const over = await refused(
  () => Sandbox.create("base", { timeoutMs: (MAX_TIMEOUT + 1) * 1000 }),
  Error,
  "a timeout past the plan's",
);
check(String(over.message).includes("Timeout cannot be greater"), `over the plan: ${over.message}`);
ok("timeout-max");

const others = [];
for (let i = 0; i <= LIST_PAGE; i++) {
  others.push(await Sandbox.create("base", { timeoutMs: 60_000, metadata: TAG }));
}
const stranger = await Sandbox.create("base", { timeoutMs: 60_000, metadata: { judge: "other" } });
const pages = Sandbox.list({ query: { metadata: TAG }, limit: LIST_PAGE });
const found = [];
let n = 0;
while (pages.hasNext) {
  const items = await pages.nextItems();
  check(items.length <= LIST_PAGE, `a page of ${items.length}`);
  found.push(...items.map((i) => i.sandboxId));
  n += 1;
}
const want = new Set([sbx.sandboxId, ...others.map((o) => o.sandboxId)]);
check(found.length === want.size && found.every((f) => want.has(f)), `listed ${found}, want ${[...want]}`);
check(n >= 2, `pages ${n}`);
for (const o of [...others, stranger]) await o.kill();
ok("list-paging");

// Steps the provider under the server cannot take (JUDGE_LACKS): each refused as E2B refuses a
// feature it lacks (501; 400 for a create it cannot honour), never as a sandbox not found, the
// sandbox running on; passed as `<step>-lacked`.
const LACKS = new Set((env.JUDGE_LACKS ?? "").split(",").filter(Boolean));
async function lacked(step, attempt, status = "501") {
  let refusal;
  try {
    await attempt();
  } catch (e) {
    refusal = e;
  }
  check(refusal !== undefined, `${step}: taken where the provider lacks it`);
  check(
    String(refusal?.message).includes(status) && !(refusal instanceof NotFoundError),
    `${step}: ${refusal?.constructor?.name}: ${refusal?.message}`,
  );
  check(await sbx.isRunning(), `${step}: the sandbox runs on`);
  ok(`${step}-lacked`);
}

async function pauseAndResume() {
  await sbx.files.write("/tmp/kept", "kept across the pause");
  const bg = await sbx.commands.run("sleep 100", { background: true });
  await sbx.pause();
  check((await Sandbox.getInfo(sbx.sandboxId)).state === "paused", "paused state");
  const paused = await Sandbox.list({ query: { metadata: TAG, state: ["paused"] } }).nextItems();
  check(paused.map((p) => p.sandboxId).join(",") === sbx.sandboxId, `paused list ${JSON.stringify(paused)}`);
  const resumed = await Sandbox.connect(sbx.sandboxId);
  check((await Sandbox.getInfo(sbx.sandboxId)).state === "running", "running again");
  check((await resumed.files.read("/tmp/kept")) === "kept across the pause", "the file kept");
  check((await resumed.commands.list()).every((p) => p.pid !== bg.pid), "programs ended by the pause");
  check((await resumed.commands.run("echo again")).stdout === "again\n", "runs after resume");
  ok("pause-resume");
  return resumed;
}

async function snapshot(resumed) {
  // A snapshot of the files: a sandbox made from it holds them; listed by its sandbox; deleted.
  await resumed.files.write("snap.txt", "in the snapshot");
  const snap = await resumed.createSnapshot();
  const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 });
  check((await fromSnap.files.read("snap.txt")) === "in the snapshot", "a sandbox from the snapshot has its files");
  await fromSnap.kill();
  const snaps = await Sandbox.listSnapshots({ sandboxId: resumed.sandboxId }).nextItems();
  check(snaps.map((x) => x.snapshotId).join(",") === snap.snapshotId, `the sandbox's snapshots: ${JSON.stringify(snaps)}`);
  if (MODE === "serve") {
    // The SDK reads a create's 404 as a SandboxError.
    const theirs = await refused(
      () => Sandbox.create(snap.snapshotId, { timeoutMs: 60_000, apiKey: env.JUDGE_OTHER_KEY }),
      Error,
      "another key's start from the snapshot",
    );
    check(/404.*not found/.test(theirs.message), `another key's start from the snapshot: ${theirs.message}`);
  }
  check(await Sandbox.deleteSnapshot(snap.snapshotId), "delete the snapshot");
  check(!(await Sandbox.deleteSnapshot(snap.snapshotId)), "delete it again");
  ok("snapshot");
}

async function forked(resumed) {
  const forks = await resumed.fork({ count: 2, timeoutMs: 60_000 });
  check(forks.length === 2 && forks.every((f) => !(f instanceof Error)), `forks: ${forks}`);
  check(new Set([...forks.map((f) => f.sandboxId), resumed.sandboxId]).size === 3, "each fork a sandbox of its own");
  for (const f of forks) {
    check((await f.files.read("snap.txt")) === "in the snapshot", "a fork holds the files");
    await f.kill();
  }
  ok("fork");
}

let resumed = sbx;
if (LACKS.has("pause-resume")) {
  await lacked("pause-resume", () => sbx.pause());
} else {
  resumed = await pauseAndResume();
}
if (LACKS.has("snapshot")) {
  await lacked("snapshot", () => sbx.createSnapshot());
} else {
  await snapshot(resumed);
}
if (LACKS.has("fork")) {
  await lacked("fork", () => sbx.fork({ count: 1, timeoutMs: 60_000 }));
} else {
  await forked(resumed);
}

if (MODE === "serve") {
  const other = env.JUDGE_OTHER_KEY;
  const boxes = await boxesOf(sbx.sandboxId, env.E2B_API_KEY);
  check(boxes.length === 1, `the sandbox is one box of the service's: ${boxes}`);
  check((await boxesOf(sbx.sandboxId, other)).length === 0, "another key sees its box");
  const theirs = await Sandbox.list({ apiKey: other }).nextItems();
  check(
    theirs.every((i) => i.sandboxId !== sbx.sandboxId),
    `another key lists it: ${JSON.stringify(theirs)}`,
  );
  await refused(() => Sandbox.getInfo(sbx.sandboxId, { apiKey: other }), NotFoundError, "another key's getInfo");
  await refused(() => Sandbox.connect(sbx.sandboxId, { apiKey: other }), NotFoundError, "another key's connect");
  check(!(await Sandbox.kill(sbx.sandboxId, { apiKey: other })), "another key killed the sandbox");
  check((await Sandbox.getInfo(sbx.sandboxId)).state === "running", "still running");
  ok("owners");

  if (LACKS.has("network")) {
    await lacked(
      "network",
      () => Sandbox.create("base", { timeoutMs: 60_000, network: { denyOut: ["0.0.0.0/0"], allowOut: ["example.com"] } }),
      "400",
    );
  } else {
    // E2B's network lists as agentbox's allowlist, kept by its egress proxy.
    const walled = await Sandbox.create("base", {
      timeoutMs: 60_000,
      network: { denyOut: ["0.0.0.0/0"], allowOut: ["example.com"] },
    });
    const facts = (await boxInfo(walled.sandboxId)).facts.network;
    check(JSON.stringify(facts) === JSON.stringify({ allowlist: ["example.com"] }), `the box's network: ${JSON.stringify(facts)}`);
    await walled.kill();
    const partial = await refused(
      () => Sandbox.create("base", { timeoutMs: 60_000, network: { denyOut: ["192.0.2.1"] } }),
      Error,
      "a deny list other than all traffic",
    );
    check(String(partial.message).includes("allowlists"), `a partial deny list: ${partial.message}`);
    ok("network");
  }
}

const victim = await Sandbox.create("base", { timeoutMs: 120_000 });
setTimeout(() => {
  if (MODE === "fake") {
    console.log(`VANISH ${victim.sandboxId}`);
  } else {
    endElsewhere(victim.sandboxId).catch((e) => console.error(`ending the box: ${e}`));
  }
}, 2000);
const t0 = Date.now();
try {
  await victim.commands.run("sleep 30");
  throw new Error("judge: a vanished sandbox's command ended well");
} catch (e) {
  const took = (Date.now() - t0) / 1000;
  console.log(`vanish: ${e?.constructor?.name} after ${took.toFixed(1)}s: ${String(e?.message).slice(0, 200)}`);
  check(took < 20, `the vanish took ${took}s to show`);
  check(!(e instanceof CommandExitError), `vanish: a command's exit, not a lost sandbox: ${e?.message}`);
  // The SDK's words for a sandbox lost under a request: "killed or reached its end of life".
  check(/not running|not found|killed/i.test(String(e?.message)), `vanish: ${e?.constructor?.name}: ${e?.message}`);
}
check(!(await Sandbox.kill(victim.sandboxId)), "kill of a vanished one");
ok("vanish");

check(await resumed.kill(), "kill");
check(!(await Sandbox.kill(sbx.sandboxId)), "kill again");
await refused(() => Sandbox.getInfo(sbx.sandboxId), NotFoundError, "a killed sandbox's info");
if (MODE === "serve") {
  for (const s of [sbx, victim, ...others, stranger]) {
    check((await boxesOf(s.sandboxId, env.E2B_API_KEY)).length === 0, `${s.sandboxId}: its box outlived it`);
  }
}
ok("kill-sandbox");

await refused(() => Sandbox.create("base", { apiKey: "e2b_wrong" }), AuthenticationError, "a wrong key");
ok("bad-key");
