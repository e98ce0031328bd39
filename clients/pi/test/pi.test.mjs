// The extension judged by pi itself: pi's agent loop (its faux model scripted) calls the tools,
// with the extension loaded and without it. `cargo test -p agentbox-cli --test pi_extension`
// runs this with AGENTBOX_BIN (the binary the extension starts as its own service),
// AGENTBOX_HOME, and AGENTBOX_TEST_PI_PROVIDERS (the providers to judge on, comma-separated;
// `e2b` talks to the fake E2B whose address the test exported).
import assert from "node:assert/strict";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { closeSession, pullNow, runSession } from "./harness.mjs";

function env(name) {
  const v = process.env[name];
  if (!v)
    throw new Error(
      `${name} is not set: run through cargo test -p agentbox-cli --test pi_extension`,
    );
  return v;
}
env("AGENTBOX_BIN");
const providers = env("AGENTBOX_TEST_PI_PROVIDERS").split(",");

/** A 1x1 PNG. */
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==",
  "base64",
);

/** The directory both sides start from. */
function fixture(dir) {
  mkdirSync(join(dir, "src/nested"), { recursive: true });
  writeFileSync(join(dir, "README.md"), "# fixture\nhello world\nsecond line\n");
  writeFileSync(join(dir, "src/main.js"), 'const greeting = "hello";\nconsole.log(greeting);\n');
  writeFileSync(join(dir, "src/nested/deep.txt"), "deep hello\n");
  writeFileSync(join(dir, "crlf.txt"), "one\r\ntwo\r\nthree\r\n");
  writeFileSync(
    join(dir, "long.txt"),
    Array.from({ length: 3000 }, (_, i) => `line ${i + 1}`).join("\n"),
  );
  writeFileSync(join(dir, "wide.txt"), `${"x".repeat(60_000)}\nshort\n`);
  writeFileSync(join(dir, "binary.bin"), Buffer.from([0, 1, 2, 3, 255, 254, 0, 10, 65]));
  writeFileSync(join(dir, "pixel.png"), PNG);
  writeFileSync(join(dir, "dup.txt"), "same\nsame\n");
}

/** Every tool, and the ways each fails, as a model would call them. */
const CALLS = [
  { name: "read", args: { path: "README.md" } },
  { name: "read", args: { path: "long.txt" } },
  { name: "read", args: { path: "long.txt", offset: 2990, limit: 5 } },
  { name: "read", args: { path: "long.txt", offset: 10, limit: 3 } },
  { name: "read", args: { path: "long.txt", offset: 5000 } },
  { name: "read", args: { path: "wide.txt" } },
  { name: "read", args: { path: "binary.bin" } },
  { name: "read", args: { path: "pixel.png" } },
  { name: "read", args: { path: "missing.txt" } },
  { name: "read", args: { path: "src" } },
  { name: "write", args: { path: "made/by/tool.txt", content: "written\nby the tool\n" } },
  { name: "read", args: { path: "made/by/tool.txt" } },
  {
    name: "edit",
    args: { path: "README.md", edits: [{ oldText: "hello world", newText: "hello box" }] },
  },
  { name: "edit", args: { path: "README.md", edits: [{ oldText: "not there", newText: "x" }] } },
  { name: "edit", args: { path: "dup.txt", edits: [{ oldText: "same", newText: "other" }] } },
  { name: "edit", args: { path: "crlf.txt", edits: [{ oldText: "two", newText: "TWO" }] } },
  { name: "edit", args: { path: "missing.txt", edits: [{ oldText: "a", newText: "b" }] } },
  {
    name: "edit",
    args: { path: "README.md", edits: [{ oldText: "second line", newText: "second line" }] },
  },
  { name: "bash", args: { command: "echo out; cat README.md" } },
  { name: "bash", args: { command: "echo err >&2" } },
  { name: "bash", args: { command: "echo failing; exit 3" } },
  { name: "bash", args: { command: "cat crlf.txt | wc -l; cat < /dev/null; cat" } },
  { name: "bash", args: { command: "seq 1 5000" } },
  { name: "bash", args: { command: "echo started; sleep 30", timeout: 1 } },
  { name: "bash", args: { command: "printf 'no newline'" } },
  { name: "bash", args: { command: "true" } },
  { name: "bash", args: { command: "[[ -n $BASH_VERSION ]] && echo {1..3}" } },
  { name: "grep", args: { pattern: "hello" } },
  { name: "grep", args: { pattern: "HELLO", ignoreCase: true, path: "src" } },
  { name: "grep", args: { pattern: "greeting", context: 1 } },
  { name: "grep", args: { pattern: "line", path: "long.txt", limit: 3 } },
  { name: "grep", args: { pattern: "a(", literal: true } },
  { name: "grep", args: { pattern: "hello", glob: "*.js" } },
  { name: "grep", args: { pattern: "x", path: "nowhere" } },
  { name: "find", args: { pattern: "*.txt" } },
  { name: "find", args: { pattern: "**/*.js" } },
  { name: "find", args: { pattern: "*.none" } },
  { name: "find", args: { pattern: "*", path: "nowhere" } },
  { name: "ls", args: {} },
  { name: "ls", args: { path: "src" } },
  { name: "ls", args: { path: "README.md" } },
  { name: "ls", args: { path: "nowhere" } },
  { name: "ls", args: { limit: 2 } },
];

/**
 * Calls whose text differs from pi's own, each for the reason clients/pi/README.md gives:
 * their outcome (`isError`) is still the same.
 */
const DIFFERS = {};

/**
 * pi's own find runs fd with --no-require-git, which fd 8.6 (Debian's) does not know: on this
 * machine pi's find fails. The box's answers as pi's does with a newer fd, checked here.
 */
const FIND = {
  'find {"pattern":"*.txt"}':
    "crlf.txt\ndup.txt\nlong.txt\nmade/by/tool.txt\nsrc/nested/deep.txt\nwide.txt",
  'find {"pattern":"**/*.js"}': "src/main.js",
  'find {"pattern":"*.none"}': "No files found matching pattern",
  'find {"pattern":"*","path":"nowhere"}': "Path not found: <cwd>/nowhere",
};

/**
 * A result as it reads whichever directory it ran in: the directory's path said as `<cwd>`,
 * and the temporary file pi keeps a long output in as `<full output>`.
 */
function normal(r, dir) {
  let text = JSON.stringify(r).split(dir).join("<cwd>");
  text = text.replace(/\/tmp\/pi-bash-[^"\]\s]+/g, "<full output>");
  const n = JSON.parse(text);
  // pi's own grep gives files in ripgrep's order, which varies from run to run (it searches
  // in parallel); the box's come in path order. Lines are compared, not their order.
  if (n.name === "grep" && !n.isError) {
    n.content = n.content.map((c) => ({ ...c, text: c.text.split("\n").sort().join("\n") }));
  }
  return n;
}

async function session(o) {
  const agentDir = mkdtempSync(join(tmpdir(), "pi-agent-"));
  process.env.PI_CODING_AGENT_DIR = agentDir;
  try {
    return await runSession({ agentDir, ...o });
  } finally {
    delete process.env.PI_CODING_AGENT_DIR;
  }
}

for (const provider of providers) {
  describe(`pi's tools on ${provider} boxes`, () => {
    it("give what pi's own give on this machine, call for call", async () => {
      const here = mkdtempSync(join(tmpdir(), "pi-here-"));
      const boxed = mkdtempSync(join(tmpdir(), "pi-boxed-"));
      fixture(here);
      cpSync(here, boxed, { recursive: true });
      const own = await session({ cwd: here, boxed: false, calls: CALLS });
      const ours = await session({
        cwd: boxed,
        boxed: true,
        calls: CALLS,
        flags: { "agentbox-provider": provider },
      });
      try {
        assert.deepEqual(ours.errors, []);
        assert.equal(own.results.length, CALLS.length);
        assert.equal(ours.results.length, CALLS.length);
        const differ = [];
        for (let i = 0; i < CALLS.length; i++) {
          const call = `${CALLS[i].name} ${JSON.stringify(CALLS[i].args)}`;
          const [a, b] = [normal(ours.results[i], boxed), normal(own.results[i], here)];
          if (FIND[call] !== undefined) {
            assert.equal(a.content[0].text, FIND[call], call);
            assert.equal(a.isError, FIND[call].startsWith("Path not found"), call);
            continue;
          }
          if (DIFFERS[call]) {
            // Documented (clients/pi/README.md): the same outcome, said otherwise.
            assert.equal(a.isError, b.isError, call);
            continue;
          }
          try {
            assert.deepEqual(a, b, call);
          } catch (e) {
            differ.push(e.message);
          }
        }
        assert.deepEqual(differ, []);
        // What the box changed came back; the files it left alone are as they were.
        await pullNow(ours.session);
        for (const f of ["README.md", "crlf.txt", "made/by/tool.txt", "dup.txt"]) {
          assert.deepEqual(readFileSync(join(boxed, f)), readFileSync(join(here, f)), f);
        }
      } finally {
        await closeSession(own.session);
        await closeSession(ours.session);
        rmSync(here, { recursive: true, force: true });
        rmSync(boxed, { recursive: true, force: true });
      }
    });

    it("run a whole session in the box: its changes come back, nothing runs here", async () => {
      const cwd = mkdtempSync(join(tmpdir(), "pi-session-"));
      const marker = join(tmpdir(), `pi-marker-${process.pid}-${provider}`);
      fixture(cwd);
      const calls = [
        { name: "ls", args: {} },
        { name: "read", args: { path: "README.md" } },
        { name: "grep", args: { pattern: "hello" } },
        { name: "find", args: { pattern: "**/*.txt" } },
        { name: "write", args: { path: "notes/new.md", content: "made in the box\n" } },
        {
          name: "edit",
          args: { path: "src/main.js", edits: [{ oldText: '"hello"', newText: '"box"' }] },
        },
        {
          name: "bash",
          args: {
            command: `touch ${marker} && rm dup.txt && mkdir -p built .git/hooks .pi && echo ok > built/out.txt && echo evil > .git/hooks/pre-commit && echo '{}' > .pi/agentbox.json && hostname`,
          },
        },
      ];
      const {
        session: s,
        results,
        errors,
      } = await session({
        cwd,
        boxed: true,
        calls,
        flags: { "agentbox-provider": provider },
      });
      try {
        assert.deepEqual(errors, []);
        assert.deepEqual(
          results.map((r) => [r.name, r.isError]),
          calls.map((c) => [c.name, false]),
          JSON.stringify(results),
        );
        await pullNow(s);
        assert.equal(readFileSync(join(cwd, "notes/new.md"), "utf8"), "made in the box\n");
        assert.match(readFileSync(join(cwd, "src/main.js"), "utf8"), /"box"/);
        assert.equal(readFileSync(join(cwd, "built/out.txt"), "utf8"), "ok\n");
        assert.equal(existsSync(join(cwd, "dup.txt")), false, "a removal in the box comes back");
        // What would run here unasked never comes back.
        assert.equal(existsSync(join(cwd, ".git/hooks/pre-commit")), false);
        assert.equal(existsSync(join(cwd, ".pi/agentbox.json")), false);
        assert.equal(existsSync(marker), false, "the marker command ran here, not in the box");
        const said = results.at(-1).content[0].text.trim();
        assert.notEqual(said, (await import("node:os")).hostname(), "bash ran on this machine");
      } finally {
        await closeSession(s);
        rmSync(cwd, { recursive: true, force: true });
      }
    });
  });
}
