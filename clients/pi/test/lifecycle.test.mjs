// The extension's life in a session, on namespace boxes: its status line and /agentbox, a box
// lost mid-session (said in one line, offered anew, nothing run here), /resume finding the same
// box, the user's ! commands, and an abort killing the command's process group in the box.
// `cargo test -p agentbox-cli --test pi_extension` runs it (AGENTBOX_BIN, AGENTBOX_HOME).
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";

import { closeSession, recordingUI, runSession, userBash } from "./harness.mjs";

let cwd;
let agentDir;
beforeEach(() => {
  cwd = mkdtempSync(join(tmpdir(), "pi-life-"));
  agentDir = mkdtempSync(join(tmpdir(), "pi-life-agent-"));
  process.env.PI_CODING_AGENT_DIR = agentDir;
  writeFileSync(join(cwd, "README.md"), "hello\n");
});
afterEach(() => {
  delete process.env.PI_CODING_AGENT_DIR;
  rmSync(cwd, { recursive: true, force: true });
  rmSync(agentDir, { recursive: true, force: true });
});

const text = (r) => r.content.map((c) => c.text ?? "").join("");

describe("a session's box", () => {
  it("shows in the status line and /agentbox; lost, it is said and offered anew, never run here", async () => {
    const { ui, seen } = recordingUI([true, false]);
    const s = await runSession({ cwd, agentDir, boxed: true, calls: [], ui });
    try {
      const status = seen.status.get("agentbox");
      assert.match(status, /^agentbox namespace:\S+ · 1[45]m left$/, status);
      const id = status.split(" ")[1];
      await s.session.prompt("/agentbox");
      assert.match(seen.notes.at(-1).message, new RegExp(`^agentbox ${id} \\(running, `));
      await s.session.prompt("/agentbox extend 30");
      assert.match(seen.notes.at(-1).message, /^agentbox: 4[45]m left$/);
      // Asleep, it is woken by the next call.
      await s.session.prompt("/agentbox sleep");
      assert.equal(seen.notes.at(-1).message, "agentbox: asleep; the next tool call wakes it");
      assert.equal(seen.status.get("agentbox"), `agentbox ${id} · asleep`);
      const [woken] = await s.prompt([{ name: "read", args: { path: "README.md" } }]);
      assert.deepEqual([woken.isError, text(woken)], [false, "hello\n"]);
      await s.session.prompt("/agentbox bogus");
      assert.match(seen.notes.at(-1).message, /bogus: not a verb/);
      // Ended (the first confirm says yes): the next call says so, in one line, and the offer
      // of a new box (the second confirm) is declined.
      await s.session.prompt("/agentbox end");
      const marker = join(tmpdir(), `pi-lost-${process.pid}`);
      const [lost] = await s.prompt([{ name: "bash", args: { command: `touch ${marker}` } }]);
      assert.equal(lost.isError, true);
      assert.equal(
        text(lost),
        `agentbox: the box ${id} is gone (ended or lost); nothing ran. /agentbox new makes a new box`,
      );
      assert.equal(existsSync(marker), false, "a lost box's call ran here");
      assert.match(seen.confirms.at(-1), /gone .*Make a new box, seeded from here\?/);
      assert.equal(seen.status.get("agentbox"), "agentbox: box lost");
      // /agentbox new: a new box, seeded from here, and calls work again.
      await s.session.prompt("/agentbox new");
      assert.match(seen.notes.at(-1).message, /^agentbox: a new box, namespace:\S+, seeded from /);
      const [read] = await s.prompt([{ name: "read", args: { path: "README.md" } }]);
      assert.deepEqual([read.isError, text(read)], [false, "hello\n"]);
      // The same name, so the same id: a box made anew, running.
      assert.match(seen.status.get("agentbox"), /^agentbox namespace:\S+ · 1[45]m left$/);
    } finally {
      await closeSession(s.session);
    }
  });

  it("is found again by /resume, woken, with what it held", async () => {
    const sessionId = `resume-${process.pid}`;
    const first = await runSession({
      cwd,
      agentDir,
      boxed: true,
      sessionId,
      config: { onExit: "sleep" },
      calls: [{ name: "bash", args: { command: "echo kept > box-only.txt; hostname" } }],
    });
    const host = text(first.results[0]).trim();
    await closeSession(first.session); // the box sleeps
    writeFileSync(join(cwd, "box-only.txt"), "gone here\n"); // an edit here, after the pull
    const again = await runSession({
      cwd,
      agentDir,
      boxed: true,
      sessionId,
      calls: [{ name: "bash", args: { command: "cat box-only.txt; hostname" } }],
    });
    try {
      assert.deepEqual(again.errors, []);
      assert.equal(text(again.results[0]), `kept\n${host}\n`, "the same box, woken");
      // Resumed, it pulled instead of seeding: the edit made here is left as it is.
      assert.equal(readFileSync(join(cwd, "box-only.txt"), "utf8"), "gone here\n");
    } finally {
      await closeSession(again.session);
    }
  });

  it("runs the user's ! commands in the box, and brings back what they change", async () => {
    const s = await runSession({ cwd, agentDir, boxed: true, calls: [] });
    const marker = join(tmpdir(), `pi-bang-${process.pid}`);
    try {
      const r = await userBash(s.session, `touch ${marker} && echo made > bang.txt && echo ran`);
      assert.deepEqual([r.output, r.exitCode], ["ran\n", 0]);
      assert.equal(existsSync(marker), false, "the ! command ran here");
      assert.equal(readFileSync(join(cwd, "bang.txt"), "utf8"), "made\n");
    } finally {
      await closeSession(s.session);
    }
  });

  it("streams bash's output as it comes, and an abort kills its process group in the box", async () => {
    const s = await runSession({ cwd, agentDir, boxed: true, calls: [] });
    try {
      const bash = s.session.extensionRunner.getToolDefinition("bash");
      const abort = new AbortController();
      const updates = [];
      const running = bash.execute(
        "t1",
        { command: "echo started; sleep 300 & sleep 301; echo never" },
        abort.signal,
        (u) => {
          updates.push(text(u));
          if (text(u).includes("started")) abort.abort();
        },
        undefined,
      );
      await assert.rejects(running, (e) => {
        assert.equal(e.message, "started\n\n\nCommand aborted");
        return true;
      });
      assert.ok(updates.includes("started\n"), JSON.stringify(updates));
      const left = await bash.execute(
        "t2",
        {
          command:
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 30[01]' || true",
        },
        undefined,
        undefined,
        undefined,
      );
      assert.equal(text(left), "0\n", "a sleep of the aborted command is still running");
    } finally {
      await closeSession(s.session);
    }
  });
});
