// pi's read and bash through the extension (a namespace box unless AGENTBOX_PI_BENCH_PROVIDER
// says otherwise) beside pi's own on this machine, in one run, as medians and ratios; then the
// memory the extension adds to pi's process over many tool calls.
//
//   node --expose-gc bench/tools.mjs            # AGENTBOX_BIN, or agentbox on the PATH
//
// AGENTBOX_PI_BENCH_ROUNDS (default 200) calls of each tool on each side;
// AGENTBOX_PI_BENCH_CALLS (default 10000) calls for the memory figure.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { createBashToolDefinition, createReadToolDefinition } from "@mariozechner/pi-coding-agent";

import { closeSession, runSession } from "../test/harness.mjs";

const rounds = Number(process.env.AGENTBOX_PI_BENCH_ROUNDS ?? 200);
const calls = Number(process.env.AGENTBOX_PI_BENCH_CALLS ?? 10_000);
const provider = process.env.AGENTBOX_PI_BENCH_PROVIDER ?? "namespace";

const cwd = mkdtempSync(join(tmpdir(), "pi-bench-"));
writeFileSync(join(cwd, "file.txt"), Array.from({ length: 200 }, (_, i) => `line ${i}`).join("\n"));
process.env.PI_CODING_AGENT_DIR = mkdtempSync(join(tmpdir(), "pi-bench-agent-"));
const { session } = await runSession({
  cwd,
  agentDir: process.env.PI_CODING_AGENT_DIR,
  boxed: true,
  calls: [],
  flags: { "agentbox-provider": provider },
});
const tool = (name) => session.extensionRunner.getToolDefinition(name);
const boxed = { read: tool("read"), bash: tool("bash") };
const own = { read: createReadToolDefinition(cwd), bash: createBashToolDefinition(cwd) };
const args = { read: { path: "file.txt" }, bash: { command: "echo hello" } };

async function median(def, a, n) {
  const times = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    const r = await def.execute(`b${i}`, a, undefined, undefined, undefined);
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
    if (r.isError) throw new Error(JSON.stringify(r));
  }
  times.sort((x, y) => x - y);
  return times[Math.floor(n / 2)];
}

console.log(
  `pi's tools: through the extension (${provider} box) beside pi's own, ${rounds} calls each`,
);
for (const name of ["read", "bash"]) {
  await median(boxed[name], args[name], 5);
  await median(own[name], args[name], 5);
  const ours = await median(boxed[name], args[name], rounds);
  const theirs = await median(own[name], args[name], rounds);
  console.log(
    `${name}: ${ours.toFixed(2)} ms vs ${theirs.toFixed(2)} ms median, ratio ${(ours / theirs).toFixed(2)}x`,
  );
}

const heap = () => {
  globalThis.gc?.();
  return process.memoryUsage().heapUsed;
};
const before = heap();
for (let i = 0; i < calls; i++) {
  await boxed[i % 2 ? "bash" : "read"].execute(
    `m${i}`,
    args[i % 2 ? "bash" : "read"],
    undefined,
    undefined,
    undefined,
  );
}
const after = heap();
console.log(
  `memory: ${((after - before) / 1024 / 1024).toFixed(2)} MiB of heap added after ${calls} tool calls (read and bash)${globalThis.gc ? "" : " (no --expose-gc: not collected first)"}`,
);
await closeSession(session);
rmSync(cwd, { recursive: true, force: true });
