// The client against a real `agentbox serve`, which `cargo test -p agentbox-cli --test
// typescript_client` starts and names here: AGENTBOX_URL, two keys (AGENTBOX_TEST_KEY_A and _B),
// the providers to run on (AGENTBOX_TEST_PROVIDERS, comma-separated) and the binary
// (AGENTBOX_BIN) for a service of the client's own.
import assert from "node:assert/strict";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { AgentboxError, Client, LocalClient, pull, seed } from "../dist/index.js";

function env(name) {
  const v = process.env[name];
  if (!v)
    throw new Error(
      `${name} is not set: run through cargo test -p agentbox-cli --test typescript_client`,
    );
  return v;
}

const url = env("AGENTBOX_URL");
const a = new Client({ url, key: env("AGENTBOX_TEST_KEY_A") });
const b = new Client({ url, key: env("AGENTBOX_TEST_KEY_B") });
const providers = env("AGENTBOX_TEST_PROVIDERS").split(",");

async function rejectsWith(promise, code) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof AgentboxError, `${e}`);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

async function readUntil(stream, want) {
  let text = "";
  for await (const ev of stream) {
    assert.equal(ev.type, "output", JSON.stringify(ev));
    text += ev.text;
    if (text.includes(want)) return text;
  }
  throw new Error(`the stream ended before ${want}: ${text}`);
}

/** A ustar archive of `files` (name to text), as a client would send one. */
function tar(files) {
  const blocks = [];
  for (const [name, text] of Object.entries(files)) {
    const body = Buffer.from(text);
    const h = Buffer.alloc(512);
    h.write(name, 0);
    h.write("0000644\0", 100);
    h.write("0000000\0", 108);
    h.write("0000000\0", 116);
    h.write(`${body.length.toString(8).padStart(11, "0")}\0`, 124);
    h.write("00000000000\0", 136);
    h.write("        ", 148);
    h.write("0", 156);
    h.write("ustar\0", 257);
    h.write("00", 263);
    let sum = 0;
    for (const byte of h) sum += byte;
    h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
    blocks.push(h, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

for (const provider of providers) {
  describe(`${provider} boxes`, () => {
    it("run programs, hold files and take tools", async () => {
      const box = await a.createBox({
        provider,
        spec: { max_lifetime_ms: 600_000, env: { GREETING: "hello" } },
      });
      try {
        assert.ok(box.id.startsWith(`${provider}:`));
        assert.equal((await box.refresh()).status, "running");
        let r = await box.exec({ argv: ["sh", "-c", "echo $GREETING; echo err >&2; exit 4"] });
        assert.deepEqual([r.exit_code, r.stdout, r.stderr], [4, "hello\n", "err\n"]);
        r = await box.exec({ command: "cat", stdin: "through stdin" });
        assert.equal(r.stdout, "through stdin");
        r = await box.exec({ command: "seq 1 200000", maxOutput: 10 });
        assert.ok(r.stdout === "1\n2\n3\n4\n5\n" && r.stdout_dropped > 0, JSON.stringify(r));
        const data = Buffer.from(Array.from({ length: 1024 }, (_, i) => i % 256));
        await box.writeFile("data/blob.bin", data);
        assert.deepEqual(await box.readFile("data/blob.bin"), data);
        assert.equal((await box.stat("data/blob.bin")).size, 1024);
        assert.deepEqual(
          (await box.listDir("data")).map((f) => f.name),
          ["blob.bin"],
        );
        await box.mkdir("a/b", true);
        await box.rename("data/blob.bin", "a/b/moved.bin");
        await rejectsWith(box.readFile("data/blob.bin"), "not_found");
        await box.remove("a", true);
        await rejectsWith(box.stat("a"), "not_found");
        await rejectsWith(box.readFile("../../etc/passwd"), "invalid");
        const t = await box.tool("bash", { command: "echo from-a-tool" });
        assert.equal(t.isError, false);
        assert.match(t.content[0].text, /from-a-tool/);
        const failed = await box.tool("read", { path: "missing.txt" });
        assert.equal(failed.isError, true);
        const unpacked = await box.uploadTar("proj", tar({ "x.txt": "ex", "src/y.txt": "why" }));
        assert.equal(unpacked.sent >= 3, true, JSON.stringify(unpacked));
        assert.equal((await box.readFile("proj/src/y.txt")).toString(), "why");
        assert.ok((await box.downloadTar("proj")).length >= 2048);
      } finally {
        await box.delete();
      }
      await rejectsWith(a.getBox(box.id), "not_found");
    });

    it("seed a directory and pull back only what changed, never an edit made here", async () => {
      const here = mkdtempSync(join(tmpdir(), "agentbox-sync-"));
      writeFileSync(join(here, "keep.txt"), "kept");
      writeFileSync(join(here, "edit.txt"), "before");
      writeFileSync(join(here, "mine.txt"), "mine");
      mkdirSync(join(here, "deep/er"), { recursive: true });
      writeFileSync(join(here, "deep/er/file.txt"), "deep");
      symlinkSync("/etc/passwd", join(here, "link"));
      const box = await a.createBox({ provider, spec: { max_lifetime_ms: 600_000 } });
      try {
        const seeded = await seed(box, here, "work");
        assert.deepEqual(seeded.skipped, ["link"], "a link is never followed");
        assert.equal((await box.readFile("work/deep/er/file.txt")).toString(), "deep");
        assert.equal(seeded.mark["edit.txt"].kind, "f");
        // Nothing changed: nothing comes back.
        let pulled = await pull(box, "work", here, seeded.mark);
        assert.deepEqual([pulled.written, pulled.deleted, pulled.hostChanged], [[], [], []]);
        // The box edits, makes, removes, and links out; this machine edits mine.txt meanwhile.
        await box.exec({
          command:
            "cd work && printf after > edit.txt && printf new > new.txt && rm keep.txt && " +
            "printf boxs > mine.txt && ln -s /etc/shadow out && mkdir -p made/dir",
        });
        writeFileSync(join(here, "mine.txt"), "mine, edited here");
        pulled = await pull(box, "work", here, pulled.mark);
        assert.deepEqual(pulled.written.sort(), ["edit.txt", "new.txt"]);
        assert.deepEqual(pulled.deleted, ["keep.txt"]);
        assert.deepEqual(pulled.hostChanged, ["mine.txt"]);
        assert.equal(readFileSync(join(here, "edit.txt"), "utf8"), "after");
        assert.equal(readFileSync(join(here, "mine.txt"), "utf8"), "mine, edited here");
        assert.equal(existsSync(join(here, "keep.txt")), false);
        assert.equal(existsSync(join(here, "out")), false, "a link the box made never lands");
        assert.ok(statSync(join(here, "made/dir")).isDirectory());
        // The edit here is named again at the next pull, and never taken.
        pulled = await pull(box, "work", here, pulled.mark);
        assert.deepEqual([pulled.written, pulled.hostChanged], [[], ["mine.txt"]]);
      } finally {
        await box.delete();
        rmSync(here, { recursive: true, force: true });
      }
    });

    it("keep a detached process, read from a cursor and streamed across a drop", async () => {
      const box = await a.createBox({ provider, spec: { max_lifetime_ms: 600_000 } });
      try {
        const p = await box.start({
          command: "echo one; read x; echo got:$x; read y; echo three; exit 5",
        });
        let s = await p.stream();
        const first = await readUntil(s, "one\n");
        s.write("hi\n");
        const second = await readUntil(s, "got:hi\n");
        const cursor = s.next;
        s.close();
        // Another client reaches it by its handle, from the cursor, with nothing repeated.
        const again = new Client({ url, key: env("AGENTBOX_TEST_KEY_A") });
        const read = await (await again.getBox(box.id)).process(p.handle).output({ after: cursor });
        assert.equal(read.chunks.length, 0);
        s = await p.stream(cursor);
        s.write(Buffer.from("x\n"));
        const third = await readUntil(s, "three\n");
        const end = await s[Symbol.asyncIterator]().next();
        assert.equal(first + second + third, "one\ngot:hi\nthree\n");
        assert.equal(end.value.type, "exit");
        assert.equal(end.value.exit.status.code, 5);
        const whole = await p.output({ after: 0 });
        assert.equal(whole.chunks.map((c) => c.text).join(""), "one\ngot:hi\nthree\n");
        assert.deepEqual(await p.wait(10_000), end.value.exit);
        await rejectsWith(
          new Client({ url, key: env("AGENTBOX_TEST_KEY_B") }).getBox(box.id),
          "not_found",
        );
      } finally {
        await box.delete();
      }
    });

    it("open a terminal, resize it and reattach to it", async () => {
      const box = await a.createBox({ provider, spec: { max_lifetime_ms: 600_000 } });
      try {
        const t = await box.terminal({
          rows: 30,
          cols: 90,
          command: "stty size; read x; stty size; echo done",
        });
        const started = await t[Symbol.asyncIterator]().next();
        assert.equal(started.value.type, "started");
        await readUntil(t, "30 90");
        t.resize(40, 100);
        t.close();
        const again = await box.process(started.value.handle).stream();
        await readUntil(again, "30 90");
        again.write("\n");
        assert.match(await readUntil(again, "done"), /40 100/);
        again.close();
      } finally {
        await box.delete();
      }
    });
  });
}

describe("keys", () => {
  it("never see each other's boxes", async () => {
    const box = await a.createBox({ provider: providers[0], spec: { max_lifetime_ms: 600_000 } });
    try {
      assert.ok((await a.listBoxes()).some((x) => x.id === box.id));
      assert.ok(!(await b.listBoxes()).some((x) => x.id === box.id));
      await rejectsWith(b.getBox(box.id), "not_found");
      const theirs = await b.getBox(box.id).catch((e) => e);
      assert.equal(theirs.status, 404);
    } finally {
      await box.delete();
    }
  });

  it("fail as AgentboxError with the service's code", async () => {
    await rejectsWith(new Client({ url, key: "abk_wrong" }).listBoxes(), "unauthenticated");
    await rejectsWith(a.createBox({ provider: "teleport" }), "invalid");
    await rejectsWith(
      new Client({ url: "http://127.0.0.1:1", key: "x", timeoutMs: 5000 }).tools(),
      "transfer_failed",
    );
  });
});

describe("a service of the client's own", () => {
  it("starts agentbox serve on a private socket and stops it", async () => {
    const c = await LocalClient.start({
      bin: env("AGENTBOX_BIN"),
      args: ["--provider", providers[0]],
    });
    const socket = c.endpoint.socket;
    try {
      const box = await c.createBox({ spec: { max_lifetime_ms: 600_000 } });
      assert.equal((await box.exec({ command: "echo local" })).stdout, "local\n");
      await box.delete();
      // Its key is an admin's: this host's runs are its to read.
      assert.ok(Array.isArray(await c.runs()));
      await rejectsWith(c.receipts(), "not_found");
    } finally {
      await c.close();
    }
    assert.equal(existsSync(socket), false);
  });

  it("keeps its key where asked, so a named box is found again by the next start", async () => {
    const keep = mkdtempSync(join(tmpdir(), "agentbox-keep-"));
    const start = () =>
      LocalClient.start({ bin: env("AGENTBOX_BIN"), args: ["--provider", providers[0]], keep });
    let c = await start();
    let first;
    try {
      first = await c.openBox({ name: "kept-box", spec: { max_lifetime_ms: 600_000 } });
      await first.writeFile("note.txt", "still here");
    } finally {
      await c.close();
    }
    assert.equal(statSync(join(keep, "key")).mode & 0o777, 0o600);
    c = await start();
    try {
      const again = await c.openBox({ name: "kept-box", spec: { max_lifetime_ms: 600_000 } });
      assert.equal(again.id, first.id);
      assert.equal((await again.readFile("note.txt")).toString(), "still here");
      await again.delete();
    } finally {
      await c.close();
      rmSync(keep, { recursive: true, force: true });
    }
  });
});
