// The page, driven in a real browser (Debian's Chromium, through playwright-core's DevTools
// protocol) against a running `agentbox serve`: what a person at the page sees, checked
// against what the API and the CLI say. crates/agentbox-cli/tests/page.rs starts the server,
// makes the keys and a run, and runs this file with:
//
//   AGENTBOX_URL           the server, http://127.0.0.1:PORT
//   AGENTBOX_KEY_ALICE     a key with boxes (its longest lifetime 1 hour)
//   AGENTBOX_KEY_BOB       a second key, which must see none of alice's
//   AGENTBOX_KEY_ADMIN     an admin key (runs, the ledger, every box)
//   AGENTBOX_PAGE_PROVIDER the provider of the boxes made here (its boxes need a runner)
//   AGENTBOX_PAGE_RUN      the run whose timeline and ledger are checked
//   AGENTBOX_PAGE_EXPECTED a JSON file: {status: `agentbox runs status`, ledger: `agentbox ledger --json`}
//   AGENTBOX_PAGE_SHOTS    where each view's screenshot goes
//   AGENTBOX_PAGE_MANY     how many boxes the list is measured with
//   AGENTBOX_URL_MANY      a server over the same keys that makes them (local boxes, no runner)
//   AGENTBOX_PAGE_SOAK_S   how long a process streams while the page's memory is measured
//   AGENTBOX_CHROMIUM      the browser (default /usr/bin/chromium)
//
// Measurements are printed as `measure: NAME VALUE UNIT` lines, never asserted.

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";

const env = (/** @type {string} */ name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: crates/agentbox-cli/tests/page.rs sets it`);
  return v;
};
const URL = env("AGENTBOX_URL");
const ALICE = env("AGENTBOX_KEY_ALICE");
const BOB = env("AGENTBOX_KEY_BOB");
const ADMIN = env("AGENTBOX_KEY_ADMIN");
const PROVIDER = env("AGENTBOX_PAGE_PROVIDER");
const RUN = env("AGENTBOX_PAGE_RUN");
const SHOTS = env("AGENTBOX_PAGE_SHOTS");
const MANY = Number(env("AGENTBOX_PAGE_MANY"));
const MANY_URL = env("AGENTBOX_URL_MANY");
const SOAK_S = Number(env("AGENTBOX_PAGE_SOAK_S"));
const origin = new globalThis.URL(URL).host;
mkdirSync(SHOTS, { recursive: true });

/**
 * A call of the API, as any client makes it.
 * @param {string} key @param {string} method @param {string} path @param {unknown} [body]
 */
async function call(key, method, path, body) {
  const r = await fetch(`${URL}${path}`, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** @param {string} key @param {Record<string, string>} [labels] */
const makeBox = (key, labels = {}) =>
  call(key, "POST", "/v1/boxes", { provider: PROVIDER, spec: { max_lifetime_ms: 30 * 60_000, labels } });

/** @type {import("playwright-core").Browser} */
let browser;
/** Every request a page made, and every console error (a CSP refusal is one). */
const requests = /** @type {string[]} */ ([]);
const problems = /** @type {string[]} */ ([]);
/** Boxes made here, ended at the end. */
const made = /** @type {[string, string][]} */ ([]);

before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.AGENTBOX_CHROMIUM ?? "/usr/bin/chromium",
    // Root in CI: Chromium's own sandbox needs a user namespace it is not given there.
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run"],
  });
});

after(async () => {
  await browser?.close();
  for (const [key, id] of made) await call(key, "DELETE", `/v1/boxes/${encodeURIComponent(id)}`).catch(() => {});
});

/** A fresh tab (its own session storage), watched. @param {{width: number, height: number}} [viewport] */
async function tab(viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.on("request", (r) => requests.push(r.url()));
  page.on("websocket", (w) => requests.push(w.url()));
  // A refused call is logged by the browser as a failed load, which is the page working; a
  // policy's refusal or a script's error is not.
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy|Refused to|agentbox page/.test(m.text()))
      problems.push(m.text());
    if (m.type() === "warning") console.log(`page warned: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(String(e)));
  return page;
}

/** @param {import("playwright-core").Page} page @param {string} key */
async function signIn(page, key) {
  await page.goto(URL);
  await page.locator("#key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#who").filter({ hasText: /\w/ }).waitFor();
}

/** @param {import("playwright-core").Page} page @param {string} name */
const shot = (page, name) => page.screenshot({ path: `${SHOTS}/${name}.png` });

/** Seconds of a lifetime shown as `4m 05s` or `12s`. @param {string} text */
function seconds(text) {
  const m = /^(?:(\d+)h )?(?:(\d+)m )?(\d+)s$/.exec(text.trim()) ?? /^(\d+)h (\d+)m$/.exec(text.trim());
  assert.ok(m, `a lifetime shown as ${JSON.stringify(text)}`);
  return text.includes("h") && !text.endsWith("s")
    ? Number(m[1]) * 3600 + Number(m[2]) * 60
    : Number(m[1] ?? 0) * 3600 + Number(m[2] ?? 0) * 60 + Number(m[3]);
}

/** @type {import("playwright-core").Page} */
let alice;
/** @type {string} */
let box;

test("signing in with a key shows its boxes, and the key goes in no URL", async () => {
  alice = await tab();
  await alice.goto(URL);
  await shot(alice, "signin");
  await signIn(alice, ALICE);
  assert.match(await alice.locator("#who").textContent(), /alice/);
  assert.equal(await alice.evaluate(() => sessionStorage.getItem("agentbox.key")), ALICE);
  assert.ok(!alice.url().includes(ALICE), alice.url());
  // A wrong key is refused, saying why.
  const other = await tab();
  await other.goto(URL);
  await other.locator("#key").fill("abk_not-a-key");
  await other.getByRole("button", { name: "Sign in" }).click();
  await other
    .locator("#signin-error")
    .filter({ hasText: /not one this server holds/ })
    .waitFor();
  await other.context().close();
});

test("a box made through the API appears without a reload, its lifetime counting down", async () => {
  let navigations = 0;
  alice.on("framenavigated", (f) => f === alice.mainFrame() && !f.url().includes("#") && navigations++);
  const made1 = await makeBox(ALICE, { team: "page" });
  box = made1.id;
  made.push([ALICE, box]);
  const row = alice.locator(`[data-box="${box}"]`);
  await row.waitFor({ timeout: 15_000 });
  const before = seconds(await row.locator(".left").textContent());
  await alice.waitForTimeout(2_500);
  const later = seconds(await row.locator(".left").textContent());
  assert.ok(later < before, `the lifetime went from ${before} s to ${later} s`);
  assert.ok(before <= 30 * 60 && before > 25 * 60, `${before} s left of 30 min`);
  // Filters: by provider, state and label.
  await alice.locator('input[name="label"]').fill("team=page");
  await row.waitFor();
  await alice.locator('input[name="label"]').fill("team=other");
  await row.waitFor({ state: "detached" });
  await alice.locator('input[name="label"]').fill("");
  await row.waitFor();
  assert.equal(navigations, 0, "the page was reloaded");
  await shot(alice, "boxes");
});

test("a process's output shows live, and after a reconnect goes on from its cursor", async () => {
  const sockets = /** @type {string[]} */ ([]);
  alice.on("websocket", (w) => w.url().includes("/stream") && sockets.push(w.url()));
  const { handle } = await call(ALICE, "POST", `/v1/boxes/${encodeURIComponent(box)}/processes`, {
    command: "for i in $(seq 1 40); do echo line-$i; sleep 0.2; done",
  });
  await alice.locator(`[data-box="${box}"]`).click();
  await alice.locator("#box-title").filter({ hasText: box }).waitFor();
  const proc = alice
    .locator("#procs tbody tr")
    .filter({ hasText: String(handle) })
    .first();
  await proc.click();
  const out = alice.locator("#output");
  await out.filter({ hasText: "line-3" }).waitFor({ timeout: 15_000 });
  // Away from the box (its socket closed), then back: the page asks from where it stopped.
  await alice.goto(`${URL}/#/boxes`);
  await alice.waitForTimeout(1_500);
  await alice.goto(`${URL}/#/box/${encodeURIComponent(box)}`);
  await proc.click();
  await out.filter({ hasText: "[exited 0]" }).waitFor({ timeout: 30_000 });
  const lines = (await out.textContent()).split("\n").filter((l) => l.startsWith("line-"));
  assert.deepEqual(
    lines,
    Array.from({ length: 40 }, (_, i) => `line-${i + 1}`),
    "every line once, in order",
  );
  assert.equal(sockets.length, 2, sockets.join("\n"));
  const again = Number(new globalThis.URL(sockets[1]).searchParams.get("after"));
  assert.ok(again > 0, `the second stream began at byte ${again}`);
  await shot(alice, "process");
});

test("the terminal runs a command, and Ctrl-C stops one", async () => {
  const xterm = await (await fetch(`${URL}/page/xterm.mjs`)).text();
  assert.ok(!xterm.includes("built without xterm.js"), "scripts/page-assets must run before agentbox is built");
  await alice.getByRole("button", { name: "Terminal" }).click();
  const screen = alice.locator("#terminal .xterm-rows");
  await screen.waitFor();
  await alice.locator("#terminal").click();
  // The terminal's shell is one of the box's processes now, listed live.
  await alice.locator("#procs tbody tr").filter({ hasText: "sh -l" }).waitFor({ timeout: 10_000 });
  await alice.keyboard.type("echo hi-$((6*7))\n");
  await screen.filter({ hasText: "hi-42" }).waitFor({ timeout: 15_000 });
  await alice.keyboard.type("sleep 300\n");
  await alice.waitForTimeout(1_000);
  await alice.keyboard.press("Control+C");
  await alice.keyboard.type("echo back-$((2+3))\n");
  // Shown only once `sleep` is gone: Ctrl-C reached it.
  await screen.filter({ hasText: "back-5" }).waitFor({ timeout: 15_000 });
  await shot(alice, "terminal");
});

test("extend moves the deadline; a refused action shows the API's error; end asks first", async () => {
  const path = `/v1/boxes/${encodeURIComponent(box)}`;
  const was = (await call(ALICE, "GET", path)).facts.ends_at_ms;
  await alice.getByRole("button", { name: "Extend 10 min" }).click();
  await alice.locator("#box-note").filter({ hasText: "extended" }).waitFor();
  const now = (await call(ALICE, "GET", path)).facts.ends_at_ms;
  assert.ok(now - was >= 9 * 60_000, `the deadline moved ${now - was} ms`);
  // Alice's longest lifetime is an hour: extending past it is refused, and the page says why.
  for (let i = 0; i < 6; i++) {
    await alice.getByRole("button", { name: "Extend 10 min" }).click();
    const said = await Promise.race([
      alice
        .locator("#box-error")
        .filter({ hasText: /\w/ })
        .waitFor()
        .then(() => "error"),
      alice
        .locator("#box-note")
        .filter({ hasText: /extended/ })
        .waitFor()
        .then(() => "note"),
    ]);
    if (said === "error") break;
  }
  const refused = await alice.locator("#box-error").textContent();
  assert.match(refused, /permission_denied|lifetime/, refused);
  await shot(alice, "refused");
  // End: asked first; cancelled, the box stays.
  await alice.getByRole("button", { name: "End", exact: true }).click();
  await alice.locator("#confirm").waitFor();
  await alice.locator("#confirm-cancel").click();
  assert.equal((await call(ALICE, "GET", path)).id, box);
  await alice.getByRole("button", { name: "End", exact: true }).click();
  await alice.locator("#confirm-ok").click();
  await alice
    .locator("#box-note")
    .filter({ hasText: "ended" })
    .waitFor({ timeout: 10_000 })
    .catch(async (e) => {
      await shot(alice, "failed-end");
      const said = await alice.evaluate(() => ({
        note: document.getElementById("box-note")?.textContent,
        error: document.getElementById("box-error")?.textContent,
        hash: location.hash,
        title: document.getElementById("box-title")?.textContent,
        view: [...document.querySelectorAll(".view:not([hidden])")].map((v) => v.id),
      }));
      throw new Error(`${e.message}\nthe page: ${JSON.stringify(said)}`);
    });
  await alice.goto(`${URL}/#/boxes`);
  await alice.locator(`[data-box="${box}"]`).waitFor({ state: "detached", timeout: 15_000 });
});

test("sleep, wake, snapshot and fork, each from its button", async () => {
  const b = await call(ALICE, "POST", "/v1/boxes", {
    provider: PROVIDER,
    spec: { max_lifetime_ms: 30 * 60_000, labels: { team: "lifecycle" }, ports: [{ port: 8000, kind: "tcp" }] },
  });
  made.push([ALICE, b.id]);
  await alice.goto(`${URL}/#/box/${encodeURIComponent(b.id)}`);
  await alice.locator("#box-title").filter({ hasText: b.id }).waitFor();
  // Its port, and where this machine reaches it.
  await alice
    .locator("#facts")
    .filter({ hasText: /8000 → \S+:\d+/ })
    .waitFor({ timeout: 15_000 });
  const state = alice.locator("#box-state");
  await state.filter({ hasText: "running" }).waitFor({ timeout: 15_000 });
  const button = (/** @type {string} */ name) => alice.getByRole("button", { name, exact: true });
  await button("Sleep").click();
  await alice.locator("#box-note").filter({ hasText: "asleep" }).waitFor({ timeout: 30_000 });
  await state.filter({ hasText: "sleeping" }).waitFor({ timeout: 15_000 });
  await button("Wake").click();
  await alice.locator("#box-note").filter({ hasText: "awake" }).waitFor({ timeout: 30_000 });
  await state.filter({ hasText: "running" }).waitFor({ timeout: 15_000 });
  await button("Snapshot").click();
  const taken = alice.locator("#box-note").filter({ hasText: /snapshot \S+ taken/ });
  await Promise.race([
    taken.waitFor({ timeout: 60_000 }),
    alice.locator("#box-error").filter({ hasText: /\w/ }).waitFor({ timeout: 60_000 }),
  ]);
  assert.equal(await alice.locator("#box-error").textContent(), "", "the snapshot was refused");
  const snapshots = await call(ALICE, "GET", "/v1/snapshots");
  assert.ok(
    snapshots.some((/** @type {any} */ s) => (s.name ?? "").startsWith("page-")),
    JSON.stringify(snapshots),
  );
  await button("Fork").click();
  const forked = alice.locator("#box-note").filter({ hasText: /forked: \S+/ });
  await Promise.race([
    forked.waitFor({ timeout: 60_000 }),
    alice.locator("#box-error").filter({ hasText: /\w/ }).waitFor({ timeout: 60_000 }),
  ]);
  assert.equal(await alice.locator("#box-error").textContent(), "", "the fork was refused");
  const child = /forked: (\S+)/.exec((await forked.textContent()) ?? "")?.[1] ?? "";
  made.push([ALICE, child]);
  // The fork is the key's, and shows in the list without a reload.
  await alice.goto(`${URL}/#/boxes`);
  await alice.locator(`[data-box="${child}"]`).waitFor({ timeout: 15_000 });
  await shot(alice, "forked");
});

test("a second key sees none of the first key's boxes", async () => {
  const kept = await makeBox(ALICE);
  made.push([ALICE, kept.id]);
  await alice.goto(`${URL}/#/boxes`);
  await alice.locator(`[data-box="${kept.id}"]`).waitFor({ timeout: 15_000 });
  const bob = await tab();
  await signIn(bob, BOB);
  await bob.locator("#count").filter({ hasText: /of/ }).waitFor();
  assert.equal(await bob.locator(`[data-box="${kept.id}"]`).count(), 0);
  assert.equal(await bob.locator("#count").textContent(), "0 of 0");
  await bob.goto(`${URL}/#/box/${encodeURIComponent(kept.id)}`);
  await bob
    .locator("#box-error")
    .filter({ hasText: /no such box/ })
    .waitFor();
  await shot(bob, "second-key");
  await bob.context().close();
  // In alice's own tab: signed out, nothing of hers stays, and bob signed in there sees none.
  await alice.getByRole("button", { name: "Sign out" }).click();
  await alice.locator("#view-signin").waitFor();
  assert.equal(await alice.evaluate(() => sessionStorage.getItem("agentbox.key")), null);
  assert.equal(await alice.locator(".row").count(), 0);
  await alice.locator("#key").fill(BOB);
  await alice.getByRole("button", { name: "Sign in" }).click();
  await alice.locator("#who").filter({ hasText: "bob" }).waitFor();
  await alice.locator("#count").filter({ hasText: "0 of 0" }).waitFor();
  assert.equal(await alice.locator(`[data-box="${kept.id}"]`).count(), 0);
});

test("a run's timeline and ledger are what the CLI says", async () => {
  const expected = JSON.parse(await readFile(env("AGENTBOX_PAGE_EXPECTED"), "utf8"));
  const admin = await tab();
  await signIn(admin, ADMIN);
  await admin.goto(`${URL}/#/runs`);
  await admin.locator("#runs tbody tr").filter({ hasText: RUN }).click();
  await admin.locator("#generations tbody tr").first().waitFor();
  const cells = (/** @type {string} */ id) =>
    admin.locator(`#${id} tbody tr`).evaluateAll((rows) => rows.map((r) => [...r.children].map((c) => c.textContent)));
  const gens = await cells("generations");
  assert.deepEqual(
    gens.map((g) => [g[0], g[1], g[2], g[6]]),
    expected.status.generations.map((/** @type {any} */ g) => [String(g.generation), g.host, String(g.pid), g.ended]),
  );
  assert.equal(gens.length, expected.status.generation, "one row a generation");
  const calls = await cells("ledger");
  assert.deepEqual(
    calls.map((c) => [c[0], c[1], c[2]]),
    expected.ledger.map((/** @type {any} */ c) => [String(c.seq), c.op, c.target ?? ""]),
  );
  await shot(admin, "run");
  // What boxes cost: the totals, and each box's receipt, newest first.
  await admin.goto(`${URL}/#/runs`);
  await admin.locator("#receipts tbody tr").filter({ hasText: "gpu:T4" }).filter({ hasText: "0.1476" }).waitFor();
  const each = await cells("box-receipts");
  assert.deepEqual(
    each.map((r) => [r[0], r[5], r[6]]),
    [
      ["box-2", "300.0", "0.0492"],
      ["box-1", "600.0", "0.0984"],
    ],
  );
  await shot(admin, "runs");
  await admin.goto(`${URL}/#/health`);
  await admin.locator("#providers tbody tr").filter({ hasText: PROVIDER }).filter({ hasText: "yes" }).waitFor();
  await shot(admin, "health");
  // Readable on a phone: the list and a box's view in 390 px.
  const phone = await tab({ width: 390, height: 844 });
  await signIn(phone, ALICE);
  await shot(phone, "phone");
  await phone.context().close();
  await admin.context().close();
});

test("the list of many boxes renders, measured from sign-in", async () => {
  // Made through a second server over the same keys, whose boxes are local ones with no
  // runner: a thousand of them cost a process each.
  const paths = [];
  for (let i = 0; i < MANY; i += 1) paths.push(i);
  const ids = /** @type {string[]} */ ([]);
  const make = async () => {
    while (paths.pop() !== undefined) {
      const r = await fetch(`${MANY_URL}/v1/boxes`, {
        method: "POST",
        headers: { Authorization: `Bearer ${ADMIN}`, "Content-Type": "application/json" },
        body: JSON.stringify({ provider: "local", spec: { max_lifetime_ms: 20 * 60_000, labels: { many: "yes" } } }),
      });
      const text = await r.text();
      assert.equal(r.status, 201, text);
      ids.push(JSON.parse(text).id);
    }
  };
  await Promise.all([make(), make(), make(), make()]);
  try {
    const page = await tab();
    await page.goto(MANY_URL);
    await page.locator("#key").fill(ADMIN);
    await page.getByRole("button", { name: "Sign in" }).click();
    // Every box of this server's (the admin sees the other server's too, over the same home).
    await page.waitForFunction(
      (n) => Number(/of (\d+)$/.exec(document.getElementById("count")?.textContent ?? "")?.[1] ?? 0) >= n,
      MANY,
      { timeout: 60_000 },
    );
    const ms = await page.evaluate(() => performance.measure("list", "agentbox:signin", "agentbox:listed").duration);
    console.log(`measure: signin_to_a_rendered_list_of_${MANY}_boxes ${ms.toFixed(0)} ms (goal: under 1000 ms)`);
    // Filtered by a label, at once; scrolled to the end, the last box is drawn, and only what
    // is in sight is.
    await page.locator('input[name="label"]').fill("many=yes");
    await page
      .locator("#count")
      .filter({ hasText: new RegExp(`^${MANY} of`) })
      .waitFor();
    await page.locator("#list").evaluate((l) => {
      l.scrollTop = l.scrollHeight;
    });
    const last = [...ids].sort().at(-1);
    await page.locator(`[data-box="${last}"]`).waitFor();
    const drawn = await page.locator(".row").count();
    assert.ok(drawn < 100, `${drawn} rows drawn of ${MANY}: the list draws what is in sight`);
    await page.locator('input[name="label"]').fill("many=no");
    await page.locator("#count").filter({ hasText: /^0 of/ }).waitFor();
    await page.locator('input[name="label"]').fill("");
    await shot(page, "many");
    await page.context().close();
  } finally {
    const end = async () => {
      for (let id = ids.pop(); id !== undefined; id = ids.pop()) {
        await fetch(`${MANY_URL}/v1/boxes/${encodeURIComponent(id)}`, {
          method: "DELETE",
          headers: { Authorization: `Bearer ${ADMIN}` },
        });
      }
    };
    await Promise.all([end(), end(), end(), end()]);
  }
});

test("the page's memory while a process streams", async () => {
  const b = await call(ALICE, "POST", "/v1/boxes", {
    provider: PROVIDER,
    spec: { max_lifetime_ms: (SOAK_S + 300) * 1000 },
  });
  made.push([ALICE, b.id]);
  const { handle } = await call(ALICE, "POST", `/v1/boxes/${encodeURIComponent(b.id)}/processes`, {
    command: `end=$(( $(date +%s) + ${SOAK_S} )); while [ $(date +%s) -lt $end ]; do seq 1 200; sleep 0.05; done`,
  });
  const page = await tab();
  await signIn(page, ALICE);
  await page.goto(`${URL}/#/box/${encodeURIComponent(b.id)}`);
  await page
    .locator("#procs tbody tr")
    .filter({ hasText: String(handle) })
    .first()
    .click();
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Performance.enable");
  const heap = async () => {
    await cdp.send("HeapProfiler.collectGarbage");
    const { metrics } = await cdp.send("Performance.getMetrics");
    const of = (/** @type {string} */ name) => metrics.find((m) => m.name === name)?.value ?? 0;
    return { heap: of("JSHeapUsedSize") / 1048576, nodes: of("Nodes") };
  };
  await page.waitForTimeout(5_000);
  const start = await heap();
  await page.waitForTimeout(SOAK_S * 1000);
  const end = await heap();
  const shown = Number(await page.locator("#output").getAttribute("data-cursor"));
  console.log(
    `measure: page_after_${SOAK_S}s_of_streaming JS heap ${end.heap.toFixed(1)} MiB, ${end.nodes} DOM nodes ` +
      `(at 5 s: ${start.heap.toFixed(1)} MiB, ${start.nodes} nodes; ${(shown / 1048576).toFixed(1)} MiB of output streamed)`,
  );
  await page.context().close();
});

test("the page asked nothing of anywhere but the server, and broke no policy", () => {
  const ours = [origin, new globalThis.URL(MANY_URL).host];
  const elsewhere = requests.filter((u) => !ours.includes(new globalThis.URL(u).host) && !u.startsWith("data:"));
  assert.deepEqual(elsewhere, []);
  assert.deepEqual(problems, []);
});
