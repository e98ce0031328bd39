// @ts-check
// agentbox serve's page: the key's boxes, a box's processes and terminal, runs, health.
//
// Everything live comes pushed from the server (server-sent events read over fetch, so the
// key rides in a header; WebSockets with the key as a subprotocol): the page never polls.
// The key is kept in this tab's sessionStorage and never put in a URL.

import { FitAddon } from "/page/addon-fit.mjs";
import { Terminal } from "/page/xterm.mjs";

const KEY = "agentbox.key";
/** How far apart two rows of the box list are, in pixels (as app.css's --row). */
const ROW = 36;
/** The most of a process's output the page keeps, in characters: older text is let go. */
const KEEP_OUTPUT = 1 << 20;
/** The longest wait before a live view connects again. */
const MOST_BACKOFF_MS = 10_000;

/** @param {string} id */
const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * @typedef {{id: string, provider: string, labels: Record<string, string>, facts: any,
 *   state: string, owner?: string, endpoints?: any[]}} Row
 */

const page = {
  /** @type {string | null} */
  key: sessionStorage.getItem(KEY),
  me: { key: "", admin: false, terminal: false },
  /** server clock minus this one, in ms */
  skew: 0,
  /** @type {Map<string, Row>} */
  boxes: new Map(),
  /** @type {Row[]} the rows shown, filtered and sorted */
  shown: [],
  cursor: -1,
  /** @type {AbortController | null} */
  boxesFeed: null,
  /** @type {AbortController | null} */
  boxFeed: null,
  /** @type {string | null} the box whose view is open */
  box: null,
  /** @type {Row | null} */
  boxRow: null,
  /** @type {Map<string, Follower>} each process followed, by `box/handle` */
  outputs: new Map(),
  /** @type {Follower | null} */
  following: null,
  /** @type {{socket: WebSocket, term: Terminal, box: string} | null} */
  terminal: null,
  signedInAt: 0,
  firstList: true,
};

/** An error of the API: its code and message, as every answer of the server shapes it. */
class ApiError extends Error {
  /** @param {number} status @param {string} code @param {string} message */
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

/** @param {Response} r */
async function failure(r) {
  let body = { code: "unknown", message: `HTTP ${r.status}` };
  try {
    body = await r.json();
  } catch {}
  return new ApiError(r.status, body.code, body.message);
}

/**
 * One call of the API, with the key in its header.
 * @param {string} method @param {string} path @param {unknown} [body]
 */
async function api(method, path, body) {
  /** @type {Record<string, string>} */
  const headers = { Authorization: `Bearer ${page.key}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!r.ok) throw await failure(r);
  if (r.status === 204) return null;
  return r.json();
}

/**
 * Follow a view of server-sent events until `signal` aborts, connecting again (after a
 * growing wait) when the connection ends. `onOpen` runs at each connection.
 * @param {string} path @param {AbortSignal} signal
 * @param {(name: string, data: any) => void} onEvent
 * @param {(e: ApiError) => boolean} onRefused true: stop following
 */
async function follow(path, signal, onEvent, onRefused) {
  let backoff = 500;
  while (!signal.aborted) {
    try {
      const r = await fetch(path, {
        headers: { Authorization: `Bearer ${page.key}`, Accept: "text/event-stream" },
        signal,
      });
      if (!r.ok) {
        const e = await failure(r);
        if (onRefused(e)) return;
        throw e;
      }
      live(true);
      backoff = 500;
      const reader = /** @type {ReadableStream<Uint8Array>} */ (r.body)
        .pipeThrough(/** @type {any} */ (new TextDecoderStream()))
        .getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let name = "message";
          let data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) name = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trimStart();
          }
          if (!data) continue;
          // A view's failure to show an event is the page's bug, said as one; the feed goes on.
          try {
            onEvent(name, JSON.parse(data));
          } catch (e) {
            console.error(`agentbox page: ${path}: ${name}: ${e instanceof Error ? e.stack : e}`);
          }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      console.warn(`agentbox page: ${path}: the feed ended (${e}); connecting again`);
    }
    live(false);
    await new Promise((ok) => setTimeout(ok, backoff));
    backoff = Math.min(backoff * 2, MOST_BACKOFF_MS);
  }
}

/** @param {boolean} up */
function live(up) {
  $("live").textContent = up ? "● live" : "○ reconnecting…";
}

/** The server's time now, in ms since the epoch. */
const serverNow = () => Date.now() + page.skew;

/** @param {any} data an event's data, with the server's `now_ms` */
function clock(data) {
  if (typeof data.now_ms === "number") page.skew = data.now_ms - Date.now();
}

/** `1h 02m`, `4m 05s`, `12s`, or `ended`, for ms left. @param {number} ms */
function left(ms) {
  if (ms <= 0) return "ended";
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

/** @param {number} ms */
function duration(ms) {
  return ms < 1000 ? `${ms} ms` : left(ms);
}

/** @param {number | undefined} ms */
const when = (ms) =>
  ms
    ? new Date(ms)
        .toISOString()
        .replace("T", " ")
        .replace(/\.\d+Z$/, "Z")
    : "";

/**
 * A table's rows from cells.
 * @param {string} id @param {(string | number)[][]} rows
 * @param {(i: number) => void} [onPick]
 */
function fill(id, rows, onPick) {
  const body = /** @type {HTMLTableElement} */ ($(id)).tBodies[0];
  body.replaceChildren(
    ...rows.map((cells, i) => {
      const tr = document.createElement("tr");
      for (const c of cells) {
        const td = document.createElement("td");
        td.textContent = String(c);
        tr.append(td);
      }
      if (onPick) {
        tr.tabIndex = 0;
        tr.addEventListener("click", () => onPick(i));
        tr.addEventListener("keydown", (e) => {
          if (e.key === "Enter") onPick(i);
        });
      }
      return tr;
    }),
  );
}

// ---- sign-in -------------------------------------------------------------------------

function signedOut() {
  page.key = null;
  sessionStorage.removeItem(KEY);
  page.boxesFeed?.abort();
  closeBox();
  // Nothing of the last key's stays: its boxes, the output followed, the list drawn.
  for (const f of page.outputs.values()) f.stop();
  page.outputs.clear();
  page.boxes.clear();
  page.shown = [];
  $("list-space").replaceChildren();
  $("output").replaceChildren();
  page.me = { key: "", admin: false, terminal: false };
  $("nav").hidden = true;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("live").textContent = "";
  show("signin");
}

/** Sign in with the key kept: follow the key's boxes and the server's health. */
function signIn() {
  page.boxesFeed?.abort();
  const feed = new AbortController();
  page.boxesFeed = feed;
  page.firstList = true;
  page.signedInAt = performance.now();
  performance.mark("agentbox:signin");
  follow(
    "/v1/events",
    feed.signal,
    (name, data) => {
      clock(data);
      if (name === "hello") {
        // Said again each time the feed connects again: only the first shows a view.
        const first = !page.me.key;
        page.me = data;
        $("who").textContent = `${data.key}${data.admin ? " (admin)" : ""}`;
        $("nav").hidden = false;
        $("signout").hidden = false;
        $("owner-filter").hidden = !data.admin;
        $("signin-error").textContent = "";
        if (!first) return;
        if (location.hash === "" || location.hash === "#/signin") location.hash = "#/boxes";
        else route();
      } else if (name === "boxes") boxesChanged(data);
      else if (name === "health") health(data);
      else if (name === "error") $("live").textContent = `${data.code}: ${data.message}`;
    },
    (e) => {
      if (e.status === 401) {
        signedOut();
        $("signin-error").textContent = e.message;
        return true;
      }
      return false;
    },
  );
}

// ---- the box list ----------------------------------------------------------------------

/** @param {any} data */
function boxesChanged(data) {
  if (data.full) page.boxes.clear();
  for (const r of data.full ? data.boxes : data.upsert) page.boxes.set(r.id, r);
  for (const id of data.removed ?? []) page.boxes.delete(id);
  options();
  filter();
  if (page.firstList && data.full) {
    page.firstList = false;
    // Painted by the next frame: the mark the browser suite measures sign-in to.
    requestAnimationFrame(() => performance.mark("agentbox:listed"));
  }
  if (page.box && page.boxes.has(page.box)) boxHeader(/** @type {Row} */ (page.boxes.get(page.box)));
}

/** The filters' choices, from the boxes there are. */
function options() {
  const form = /** @type {HTMLFormElement} */ ($("filters"));
  for (const [name, of] of /** @type {[string, (r: Row) => string | undefined][]} */ ([
    ["provider", (r) => r.provider],
    ["state", (r) => r.state],
    ["owner", (r) => r.owner],
  ])) {
    const select = /** @type {HTMLSelectElement} */ (form.elements.namedItem(name));
    const values = [...new Set([...page.boxes.values()].map(of).filter(Boolean))].sort();
    const have = [...select.options].slice(1).map((o) => o.value);
    if (values.join("\n") === have.join("\n")) continue;
    const chosen = select.value;
    select.replaceChildren(select.options[0], ...values.map((v) => new Option(v, v)));
    select.value = values.includes(/** @type {string} */ (chosen)) ? chosen : "";
  }
}

/** Apply the filters and draw the list. */
function filter() {
  const form = /** @type {HTMLFormElement} */ ($("filters"));
  const get = (/** @type {string} */ n) => /** @type {HTMLInputElement} */ (form.elements.namedItem(n)).value.trim();
  const [provider, state, owner, label] = ["provider", "state", "owner", "label"].map(get);
  const [lk, lv] = label.split("=", 2);
  page.shown = [...page.boxes.values()]
    .filter(
      (r) =>
        (!provider || r.provider === provider) &&
        (!state || r.state === state) &&
        (!owner || r.owner === owner) &&
        (!label || (lv === undefined ? lk in r.labels : r.labels[lk] === lv)),
    )
    .sort((a, b) => a.id.localeCompare(b.id));
  $("count").textContent = `${page.shown.length} of ${page.boxes.size}`;
  $("list-empty").hidden = page.boxes.size > 0;
  $("list-space").style.height = `${page.shown.length * ROW}px`;
  draw();
}

/** Draw the rows in sight (and a few either side): a thousand boxes cost a screenful. */
function draw() {
  const list = $("list");
  const first = Math.max(0, Math.floor(list.scrollTop / ROW) - 5);
  const last = Math.min(page.shown.length, Math.ceil((list.scrollTop + list.clientHeight) / ROW) + 5);
  const rows = [];
  for (let i = first; i < last; i++) {
    const r = page.shown[i];
    const a = document.createElement("a");
    a.className = `row${i === page.cursor ? " cursor" : ""}`;
    a.href = `#/box/${encodeURIComponent(r.id)}`;
    a.setAttribute("role", "listitem");
    a.dataset.box = r.id;
    a.style.top = `${i * ROW}px`;
    const cell = (/** @type {string} */ cls, /** @type {string} */ text) => {
      const s = document.createElement("span");
      s.className = cls;
      s.textContent = text;
      return s;
    };
    const ends = r.facts.ends_at_ms ?? 0;
    const leftCell = cell("left", ends ? left(ends - serverNow()) : "–");
    if (ends) leftCell.dataset.ends = String(ends);
    a.append(
      cell("id", r.id),
      cell("provider", r.provider),
      cell(`state state-${r.state}`, r.state),
      cell("owner", r.owner ?? ""),
      leftCell,
    );
    rows.push(a);
  }
  $("list-space").replaceChildren(...rows);
}

/** Count every lifetime in sight down, once a second. */
function tick() {
  for (const el of document.querySelectorAll("[data-ends]")) {
    const ends = Number(/** @type {HTMLElement} */ (el).dataset.ends);
    if (ends) el.textContent = left(ends - serverNow());
  }
}

/** Arrow keys move through the list; Enter opens a box. @param {KeyboardEvent} e */
function listKeys(e) {
  if (!page.shown.length) return;
  const list = $("list");
  if (e.key === "ArrowDown" || e.key === "ArrowUp") {
    e.preventDefault();
    page.cursor = Math.max(0, Math.min(page.shown.length - 1, page.cursor + (e.key === "ArrowDown" ? 1 : -1)));
    const top = page.cursor * ROW;
    if (top < list.scrollTop) list.scrollTop = top;
    else if (top + ROW > list.scrollTop + list.clientHeight) list.scrollTop = top + ROW - list.clientHeight;
    draw();
  } else if (e.key === "Enter" && page.cursor >= 0 && e.target === list) {
    location.hash = `#/box/${encodeURIComponent(page.shown[page.cursor].id)}`;
  }
}

// ---- one box ---------------------------------------------------------------------------

/** @param {string} id */
function openBox(id) {
  if (page.box === id && page.boxFeed && !page.boxFeed.signal.aborted) return;
  closeBox();
  page.box = id;
  $("box-title").textContent = id;
  $("box-error").textContent = "";
  $("box-note").textContent = "";
  fill("procs", []);
  fill("refusals", []);
  $("facts").replaceChildren();
  const known = page.boxes.get(id);
  if (known) boxHeader(known);
  const feed = new AbortController();
  page.boxFeed = feed;
  follow(
    `/v1/boxes/${encodeURIComponent(id)}/events`,
    feed.signal,
    (name, data) => {
      clock(data);
      if (name === "box") boxHeader(data);
      else if (name === "processes") processes(data);
      else if (name === "refusals") refusals(data);
      else if (name === "gone") {
        $("box-state").textContent = "ended";
        $("box-state").className = "state state-ended";
        $("box-note").textContent = `ended: ${data.message}`;
        feed.abort();
      }
    },
    (e) => {
      $("box-error").textContent = e.message;
      return e.status === 404 || e.status === 401 || e.status === 403;
    },
  );
}

function closeBox() {
  page.boxFeed?.abort();
  page.boxFeed = null;
  page.box = null;
  page.following?.stop();
  page.following = null;
  closeTerminal();
  $("output-pane").hidden = true;
}

/** @param {Row} r */
function boxHeader(r) {
  // The list's rows carry no endpoints: those the box's own feed said are kept.
  if (!("endpoints" in r) && page.boxRow?.id === r.id) r = { ...r, endpoints: page.boxRow.endpoints };
  page.boxRow = r;
  const st = $("box-state");
  st.textContent = r.state;
  st.className = `state state-${r.state}`;
  const ends = r.facts.ends_at_ms ?? 0;
  const l = $("box-left");
  l.dataset.ends = ends ? String(ends) : "";
  l.textContent = ends ? left(ends - serverNow()) : "–";
  const facts = $("facts");
  /** @type {[string, string][]} */
  const shown = [
    ["provider", r.provider],
    ["isolation", r.facts.isolation],
    ["started", when(r.facts.started_at_ms)],
    ["ends", when(r.facts.ends_at_ms)],
    ["cpus", r.facts.cpus ?? ""],
    ["memory", r.facts.memory_mb ? `${r.facts.memory_mb} MB` : ""],
    ["network", r.facts.network ? JSON.stringify(r.facts.network) : ""],
    ["ports", (r.facts.ports ?? []).map((/** @type {any} */ p) => `${p.port}/${p.kind}`).join(", ")],
    [
      "endpoints",
      /** @type {any} */ (r.endpoints ?? [])
        .map((/** @type {any} */ e) =>
          e.error ? `${e.port}: ${e.error}` : `${e.port} → ${e.url ?? `${e.host}:${e.at}`}`,
        )
        .join(", "),
    ],

    ["runner", r.facts.runner ?? ""],
    ["workspace", r.facts.workspace ?? ""],
    [
      "labels",
      Object.entries(r.labels)
        .map(([k, v]) => `${k}=${v}`)
        .join(", "),
    ],
  ];
  facts.replaceChildren(
    ...shown
      .filter(([, v]) => v !== "" && v !== undefined)
      .flatMap(([k, v]) => {
        const dt = document.createElement("dt");
        dt.textContent = k;
        const dd = document.createElement("dd");
        dd.textContent = String(v);
        return [dt, dd];
      }),
  );
}

/** @param {any} data */
function processes(data) {
  $("procs-note").textContent = data.error ?? "";
  const list = data.processes ?? [];
  fill(
    "procs",
    list.map((/** @type {any} */ p) => [p.handle, (p.argv ?? []).join(" "), procState(p)]),
    (i) => watch(list[i].handle, (list[i].argv ?? []).join(" ")),
  );
}

/** How a process stands: `running`, `exited 0`, `killed by signal 9`. @param {any} p */
function procState(p) {
  if (!p || p.state === "running") return "running";
  const s = p.status ?? {};
  const how = s.signal ? `killed by signal ${s.signal}` : `exited ${s.code}`;
  return p.state === "timed_out" ? `timed out (${how})` : how;
}

/** @param {any} data */
function refusals(data) {
  $("refusals-note").textContent = data.error ?? (data.refusals?.length ? "" : "None.");
  fill(
    "refusals",
    (data.refusals ?? []).map((/** @type {any} */ r) => [when(r.at_ms), `${r.host}:${r.port}`, `${r.why} (${r.rule})`]),
  );
}

/**
 * A process's output followed over its stream's WebSocket from a byte cursor: a socket that
 * drops is opened again from the next byte wanted, so nothing the box still keeps is lost,
 * and a gap (bytes the box no longer kept) is said where it falls.
 */
class Follower {
  /** @param {string} box @param {number} handle */
  constructor(box, handle) {
    this.box = box;
    this.handle = handle;
    this.cursor = 0;
    /** whole lines (each ending in a newline), oldest first; the page's notes between NULs */
    this.lines = /** @type {string[]} */ ([]);
    /** how many of `lines` were let go since the last paint (their blocks go too) */
    this.dropped = 0;
    /** how many of `lines` the last paint drew */
    this.drawn = 0;
    /** the line being written (no newline yet) */
    this.tail = "";
    /** characters kept in `lines` */
    this.size = 0;
    this.ended = "";
    this.decoder = new TextDecoder();
    /** @type {WebSocket | null} */
    this.socket = null;
    this.stopped = true;
    this.backoff = 500;
    this.key = `${box}/${handle}`;
    /** the next paint draws everything again (another process was shown meanwhile) */
    this.whole = true;
    this.pending = false;
  }

  start() {
    if (!this.stopped || this.ended) return;
    this.stopped = false;
    this.connect();
  }

  connect() {
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/boxes/${encodeURIComponent(this.box)}/processes/${this.handle}/stream?after=${this.cursor}`;
    const socket = new WebSocket(url, ["agentbox", `agentbox.key.${page.key}`]);
    this.socket = socket;
    socket.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      this.backoff = 500;
      if (msg.type === "output") {
        const bytes = Uint8Array.from(atob(msg.data), (c) => c.charCodeAt(0));
        if (msg.seq + bytes.length <= this.cursor) return;
        const fresh = bytes.subarray(Math.max(0, this.cursor - msg.seq));
        this.cursor = msg.seq + bytes.length;
        this.add(this.decoder.decode(fresh, { stream: true }));
      } else if (msg.type === "gap") {
        this.add(`\n[bytes ${msg.from} to ${msg.to} were no longer kept by the box]\n`, true);
        this.cursor = msg.to;
      } else if (msg.type === "exit") {
        this.cursor = msg.next;
        this.ended = procState(msg.exit);
        this.add(`\n[${this.ended}]\n`, true);
      } else if (msg.type === "error") {
        this.add(`\n[${msg.code}: ${msg.message}]\n`, true);
      }
    };
    socket.onclose = () => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (this.stopped || this.ended) return;
      setTimeout(() => !this.stopped && this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, MOST_BACKOFF_MS);
    };
  }

  /** @param {string} text @param {boolean} [said] a note of the page's, not output */
  add(text, said = false) {
    // A note stands on a line of its own, its NULs inside it, so a line never splits one.
    const more = said ? `${this.tail ? "\n" : ""}\u0000${text.trim()}\u0000\n` : text;
    const joined = this.tail + more;
    const end = joined.lastIndexOf("\n") + 1;
    if (end > 0) {
      const line = joined.slice(0, end);
      this.lines.push(line);
      this.size += line.length;
    }
    this.tail = joined.slice(end);
    // Past the bound, the oldest lines go (each paint removes their blocks, never redraws all).
    while (this.size > KEEP_OUTPUT && this.lines.length > 1) {
      this.size -= /** @type {string} */ (this.lines.shift()).length;
      // A line drawn already leaves its block; one never drawn just goes.
      if (this.drawn > 0) {
        this.drawn -= 1;
        this.dropped += 1;
      }
    }
    if (page.following === this) render(this);
  }

  stop() {
    this.stopped = true;
    this.socket?.close(1000);
    this.socket = null;
  }
}

/** Show a follower's text at the next frame: many messages between two frames are drawn once. @param {Follower} f */
function render(f) {
  if (f.pending) return;
  f.pending = true;
  requestAnimationFrame(() => {
    f.pending = false;
    if (page.following === f) paint(f);
  });
}

/** Text with the page's notes (between NULs) set apart. @param {string} text */
function nodes(text) {
  return text.split("\u0000").map((p, i) => {
    if (i % 2 === 0) return document.createTextNode(p);
    const s = document.createElement("span");
    s.className = "gap";
    s.textContent = p;
    return s;
  });
}

/** One block of output: whole lines, so drawing the next costs only its own layout. @param {string} text */
function block(text) {
  const div = document.createElement("div");
  div.append(...nodes(text));
  return div;
}

/**
 * Draw what of a follower's output is not drawn yet: new lines as blocks of their own, the
 * oldest blocks removed past the bound, the line being written last. Everything is drawn
 * again only for another process.
 * @param {Follower} f
 */
function paint(f) {
  const pre = $("output");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  const tail = document.createElement("div");
  tail.append(...nodes(f.tail));
  if (f.whole || pre.dataset.follower !== f.key) {
    const all = block(f.lines.join(""));
    all.dataset.lines = String(f.lines.length);
    pre.replaceChildren(...(f.lines.length ? [all] : []), tail);
    f.whole = false;
  } else {
    // Each block says how many lines it holds: the lines let go leave the oldest blocks, a
    // block going once all of its lines have (so at most one block more than the bound is
    // kept).
    pre.lastChild?.remove();
    for (; f.dropped > 0 && pre.firstChild; f.dropped -= 1) {
      const first = /** @type {HTMLElement} */ (pre.firstChild);
      const left = Number(first.dataset.lines ?? 1) - 1;
      if (left > 0) first.dataset.lines = String(left);
      else first.remove();
    }
    const fresh = f.lines.slice(f.drawn);
    if (fresh.length) {
      const b = block(fresh.join(""));
      b.dataset.lines = String(fresh.length);
      pre.append(b);
    }
    pre.append(tail);
  }
  f.drawn = f.lines.length;
  f.dropped = 0;
  pre.dataset.follower = f.key;
  pre.dataset.cursor = String(f.cursor);
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

/** Follow process `handle` of the open box. @param {number} handle @param {string} argv */
function watch(handle, argv) {
  if (!page.box) return;
  closeTerminal();
  const key = `${page.box}/${handle}`;
  let f = page.outputs.get(key);
  if (!f) {
    f = new Follower(page.box, handle);
    page.outputs.set(key, f);
  }
  if (page.following && page.following !== f) page.following.stop();
  page.following = f;
  $("output-title").textContent = `Output of ${handle}: ${argv}`;
  $("output-pane").hidden = false;
  f.whole = true;
  render(f);
  f.start();
}

// ---- the terminal ---------------------------------------------------------------------

function openTerminal() {
  if (!page.box) return;
  if (!page.me.terminal) {
    $("box-error").textContent = "this agentbox was built without xterm.js: run scripts/page-assets, then build again";
    return;
  }
  closeTerminal();
  page.following?.stop();
  page.following = null;
  $("output-pane").hidden = true;
  $("terminal-pane").hidden = false;
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  const host = $("terminal");
  host.replaceChildren();
  term.open(host);
  fit.fit();
  const box = page.box;
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/boxes/${encodeURIComponent(box)}/terminal?rows=${term.rows}&cols=${term.cols}`;
  const socket = new WebSocket(url, ["agentbox", `agentbox.key.${page.key}`]);
  page.terminal = { socket, term, box };
  const send = (/** @type {object} */ m) => socket.readyState === WebSocket.OPEN && socket.send(JSON.stringify(m));
  socket.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    if (msg.type === "output") term.write(Uint8Array.from(atob(msg.data), (c) => c.charCodeAt(0)));
    else if (msg.type === "exit") term.write(`\r\n[${procState(msg.exit)}]\r\n`);
    else if (msg.type === "error") term.write(`\r\n[${msg.code}: ${msg.message}]\r\n`);
  };
  socket.onclose = () => {
    if (page.terminal?.socket === socket) term.write("\r\n[the terminal's connection closed]\r\n");
  };
  // Keys go in as the terminal's input: Ctrl-C is byte 3, which the box's terminal turns into
  // SIGINT for what runs in the foreground, as `box shell` does.
  term.onData((data) => send({ type: "stdin", data }));
  term.onResize(({ rows, cols }) => send({ type: "resize", rows, cols }));
  addEventListener("resize", refit);
  term.focus();
}

function refit() {
  const t = page.terminal;
  if (!t) return;
  const fit = new FitAddon();
  t.term.loadAddon(fit);
  fit.fit();
}

function closeTerminal() {
  const t = page.terminal;
  if (!t) return;
  page.terminal = null;
  removeEventListener("resize", refit);
  t.socket.close(1000);
  t.term.dispose();
  $("terminal-pane").hidden = true;
}

// ---- actions ---------------------------------------------------------------------------

/** Ask before ending a box. @param {string} text */
function confirmed(text) {
  const d = /** @type {HTMLDialogElement} */ ($("confirm"));
  $("confirm-text").textContent = text;
  return new Promise((ok) => {
    const done = (/** @type {boolean} */ yes) => {
      $("confirm-ok").onclick = null;
      $("confirm-cancel").onclick = null;
      d.close();
      ok(yes);
    };
    $("confirm-ok").onclick = () => done(true);
    $("confirm-cancel").onclick = () => done(false);
    d.onclose = () => ok(false);
    d.showModal();
    $("confirm-cancel").focus();
  });
}

/** @param {string} action */
async function act(action) {
  const id = page.box;
  if (!id) return;
  if (action === "terminal") return openTerminal();
  const path = `/v1/boxes/${encodeURIComponent(id)}`;
  $("box-error").textContent = "";
  $("box-note").textContent = "";
  try {
    if (action === "extend") {
      const r = await api("POST", `${path}/extend`, { by_ms: 10 * 60 * 1000 });
      $("box-note").textContent = `extended: ends ${when(r.facts.ends_at_ms)}`;
      boxHeader({ ...(page.boxRow ?? r), ...r, state: page.boxRow?.state ?? "running" });
    } else if (action === "sleep") {
      await api("POST", `${path}/sleep`);
      $("box-note").textContent = "asleep";
    } else if (action === "wake") {
      await api("POST", `${path}/wake`);
      $("box-note").textContent = "awake";
    } else if (action === "snapshot") {
      const name = `page-${Date.now().toString(36)}`;
      const r = await api("POST", `${path}/snapshots`, { name });
      $("box-note").textContent = `snapshot ${r.name} taken`;
    } else if (action === "fork") {
      // The fork lives as long as its parent has left, with the parent's labels (not its
      // owner's: the server writes that).
      const ends = page.boxRow?.facts.ends_at_ms ?? 0;
      const spec = {
        max_lifetime_ms: Math.max(60_000, ends - serverNow()),
        labels: Object.fromEntries(
          Object.entries(page.boxRow?.labels ?? {}).filter(([k]) => !k.startsWith("agentbox-server.")),
        ),
      };
      const made = await api("POST", `${path}/fork`, { n: 1, spec });
      $("box-note").textContent = `forked: ${made.map((/** @type {any} */ b) => b.id).join(", ")}`;
    } else if (action === "end") {
      if (!(await confirmed(`End box ${id}, with every program in it? Its files go with it.`))) return;
      await api("DELETE", path);
      $("box-note").textContent = "ended";
    }
  } catch (e) {
    $("box-error").textContent = e instanceof ApiError ? e.message : String(e);
  }
}

// ---- runs ------------------------------------------------------------------------------

async function runs() {
  $("runs-error").textContent = "";
  try {
    const list = await api("GET", "/v1/runs");
    list.sort((/** @type {any} */ a, /** @type {any} */ b) => a.id.localeCompare(b.id));
    fill(
      "runs",
      list.map((/** @type {any} */ r) => [
        r.id,
        r.status,
        r.generation,
        r.holder ? `pid ${r.holder.pid} on ${r.holder.host}` : "",
      ]),
      (i) => {
        location.hash = `#/runs/${encodeURIComponent(list[i].id)}`;
      },
    );
  } catch (e) {
    $("runs-error").textContent = String(e instanceof ApiError ? e.message : e);
    fill("runs", []);
  }
  try {
    const totals = await api("GET", "/v1/receipts");
    $("receipts-note").textContent = totals.length ? "" : "No receipt yet.";
    fill(
      "receipts",
      totals.map((/** @type {any} */ t) => [t.provider, t.kind, t.boxes, t.seconds.toFixed(1), t.cost_usd.toFixed(4)]),
    );
    const each = await api("GET", "/v1/receipts/boxes?limit=200");
    fill(
      "box-receipts",
      each.map((/** @type {any} */ r) => [
        r.box ?? "",
        r.provider ?? "",
        r.kind ?? "",
        r.from ?? "",
        r.to ?? "",
        typeof r.seconds === "number" ? r.seconds.toFixed(1) : "",
        typeof r.cost_usd === "number" ? r.cost_usd.toFixed(4) : "",
      ]),
    );
  } catch (e) {
    $("receipts-note").textContent = String(e instanceof ApiError ? e.message : e);
  }
}

/** @param {string} id */
async function run(id) {
  $("run-title").textContent = `Run ${id}`;
  $("run-error").textContent = "";
  $("by-target").hidden = true;
  try {
    const [r, calls] = await Promise.all([
      api("GET", `/v1/runs/${encodeURIComponent(id)}`),
      api("GET", `/v1/runs/${encodeURIComponent(id)}/ledger`),
    ]);
    const gens = r.generations ?? [];
    const end = serverNow();
    const span = (/** @type {any} */ g) => (g.ended_ms ?? end) - g.started_ms;
    const total = gens.reduce((n, /** @type {any} */ g) => n + Math.max(span(g), 1), 0) || 1;
    $("timeline").replaceChildren(
      ...gens.map((/** @type {any} */ g) => {
        const s = document.createElement("span");
        s.className = `g-${g.ended.split(" ")[0]}`;
        s.style.flexGrow = String(Math.max(span(g), 1) / total);
        s.title = `generation ${g.generation}: ${g.ended}`;
        return s;
      }),
    );
    fill(
      "generations",
      gens.map((/** @type {any} */ g) => [
        g.generation,
        g.host,
        g.pid,
        g.driver ?? "",
        when(g.started_ms),
        duration(span(g)),
        g.ended,
      ]),
    );
    fill(
      "ledger",
      calls.map((/** @type {any} */ c) => [
        c.seq,
        c.op,
        c.target ?? "",
        c.ok ? "ok" : `failed: ${c.error ?? ""}`,
        when(c.at),
      ]),
      (i) => calls[i].target && byTarget(calls[i].target),
    );
  } catch (e) {
    $("run-error").textContent = String(e instanceof ApiError ? e.message : e);
  }
}

/** The calls on one target, every run's. @param {string} target */
async function byTarget(target) {
  $("by-target").hidden = false;
  $("by-target-title").textContent = `Tool calls on ${target}`;
  try {
    const calls = await api("GET", `/v1/ledger?target=${encodeURIComponent(target)}&limit=200`);
    fill(
      "target-calls",
      calls.map((/** @type {any} */ c) => [c.run, c.seq, c.op, c.ok ? "ok" : `failed: ${c.error ?? ""}`, when(c.at)]),
    );
  } catch (e) {
    $("run-error").textContent = String(e instanceof ApiError ? e.message : e);
  }
}

// ---- health ----------------------------------------------------------------------------

/** @param {any} h */
function health(h) {
  $("rpm").textContent = String(h.requests_per_minute);
  $("epm").textContent = String(h.errors_per_minute);
  $("streams").textContent = String(h.streams_open);
  fill(
    "providers",
    h.providers.map((/** @type {any} */ p) => [p.name, p.up ? "yes" : "no", p.error ?? ""]),
  );
  fill(
    "by-state",
    Object.entries(h.boxes_by_state).map(([s, n]) => [s, /** @type {number} */ (n)]),
  );
}

// ---- views -----------------------------------------------------------------------------

/** @param {string} name */
function show(name) {
  for (const v of document.querySelectorAll(".view")) /** @type {HTMLElement} */ (v).hidden = v.id !== `view-${name}`;
  for (const a of document.querySelectorAll("#nav a")) {
    const mine =
      /** @type {HTMLElement} */ (a).dataset.view === name ||
      (name === "box" && /** @type {HTMLElement} */ (a).dataset.view === "boxes") ||
      (name === "run" && /** @type {HTMLElement} */ (a).dataset.view === "runs");
    if (mine) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

/** Show the view the location names. */
function route() {
  if (!page.key) {
    show("signin");
    $("key").focus();
    return;
  }
  const [, view, id] = location.hash.split("/");
  if (view !== "box") closeBox();
  if (view === "box" && id) {
    show("box");
    openBox(decodeURIComponent(id));
  } else if (view === "runs" && id) {
    show("run");
    run(decodeURIComponent(id));
  } else if (view === "runs") {
    show("runs");
    runs();
  } else if (view === "health") show("health");
  else {
    show("boxes");
    draw();
  }
}

// ---- start -----------------------------------------------------------------------------

$("signin").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = /** @type {HTMLInputElement} */ ($("key"));
  const key = input.value.trim();
  if (!key) return;
  input.value = "";
  page.key = key;
  sessionStorage.setItem(KEY, key);
  signIn();
});
$("signout").addEventListener("click", () => {
  signedOut();
  location.hash = "";
});
$("filters").addEventListener("input", filter);
$("filters").addEventListener("submit", (e) => e.preventDefault());
$("list").addEventListener("scroll", draw, { passive: true });
$("list").addEventListener("keydown", listKeys);
for (const b of document.querySelectorAll("[data-action]")) {
  b.addEventListener("click", () => act(/** @type {string} */ (/** @type {HTMLElement} */ (b).dataset.action)));
}
addEventListener("hashchange", route);
setInterval(tick, 1000);
if (page.key) signIn();
route();
