// `pi -e` of this package, with pi's own command line (print mode), its model the scripted one
// of test/scripted-model.ts: the tools run in a namespace box the extension makes through a
// service of its own (AGENTBOX_BIN), what they change comes back, nothing runs here.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";

import { EXTENSION } from "./harness.mjs";

it("pi -e runs pi's tools in a box from pi's own command line", async () => {
  const cwd = mkdtempSync(join(tmpdir(), "pi-cli-"));
  const agentDir = mkdtempSync(join(tmpdir(), "pi-cli-agent-"));
  const marker = join(tmpdir(), `pi-cli-marker-${process.pid}`);
  writeFileSync(join(cwd, "README.md"), "hello from here\n");
  writeFileSync(
    join(agentDir, "agentbox.json"),
    JSON.stringify({ onExit: "end", lifetime: "15m" }),
  );
  const script = [
    { name: "read", args: { path: "README.md" } },
    { name: "write", args: { path: "from-the-box.txt", content: "written in the box\n" } },
    { name: "bash", args: { command: `touch ${marker}; cat README.md` } },
  ];
  try {
    // stdin closed, as a terminal-less run has it: pi reads a piped stdin as the prompt's.
    const pi = spawn(
      join(EXTENSION, "node_modules/.bin/pi"),
      [
        "-e",
        EXTENSION,
        "-e",
        join(EXTENSION, "test/scripted-model.ts"),
        "--provider",
        "scripted",
        "--model",
        "scripted",
        "-p",
        "go",
      ],
      {
        cwd,
        env: {
          ...process.env,
          PI_CODING_AGENT_DIR: agentDir,
          AGENTBOX_PI_SCRIPT: JSON.stringify(script),
        },
        stdio: ["ignore", "pipe", "pipe"],
        timeout: 120_000,
      },
    );
    let stdout = "";
    let stderr = "";
    pi.stdout.on("data", (c) => {
      stdout += c;
    });
    pi.stderr.on("data", (c) => {
      stderr += c;
    });
    const [code] = await once(pi, "exit");
    assert.equal(code, 0, stderr);
    assert.equal(stdout.trim(), "done");
    assert.equal(readFileSync(join(cwd, "from-the-box.txt"), "utf8"), "written in the box\n");
    assert.equal(existsSync(marker), false, "the bash call ran here");
    // pi's session log holds the read's result, as the model saw it.
    const dir = join(agentDir, "sessions");
    const logs = readdirSync(dir, { recursive: true })
      .filter((f) => String(f).endsWith(".jsonl"))
      .map((f) => readFileSync(join(dir, String(f)), "utf8"))
      .join("");
    assert.match(logs, /"toolResult".*hello from here/);
  } finally {
    rmSync(cwd, { recursive: true, force: true });
    rmSync(agentDir, { recursive: true, force: true });
  }
});
