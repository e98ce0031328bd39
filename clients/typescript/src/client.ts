/** The client: `Client`, its `Box`es and their `Process`es. */
import { type Endpoint, MARGIN_MS, type Req, send } from "./http.js";
import type {
  BoxInfo,
  ExecResult,
  FileInfo,
  Listing,
  Output,
  ProcessState,
  ProviderInfo,
  SnapshotInfo,
  Spec,
  ToolInfo,
  ToolResult,
  Unpacked,
} from "./models.js";
import { Stream } from "./stream.js";

/** Where `agentbox serve` listens unless told otherwise. */
export const DEFAULT_URL = "http://127.0.0.1:8080";

/** How to reach the service. */
export interface ClientOptions {
  /** The service's URL (default `AGENTBOX_URL`, else http://127.0.0.1:8080). */
  url?: string;
  /** A unix socket's path instead (default `AGENTBOX_SOCKET`). */
  socket?: string;
  /** The API key (default `AGENTBOX_KEY`). */
  key?: string;
  /** Milliseconds a request may take unless the call says otherwise (default 600,000). */
  timeoutMs?: number;
  /** TLS options for an https URL (a `ca`, say). */
  tls?: Endpoint["tls"];
}

const box = (id: string) => `/v1/boxes/${encodeURIComponent(id).replace("%3A", ":")}`;
const proc = (id: string, handle: number) => `${box(id)}/processes/${Math.trunc(handle)}`;

/**
 * A client of `agentbox serve`.
 *
 * ```ts
 * const c = new Client({ key: "abk_..." });
 * const b = await c.createBox({ provider: "namespace", spec: { max_lifetime_ms: 600_000 } });
 * console.log((await b.exec({ command: "uname -a" })).stdout);
 * await b.delete();
 * ```
 */
export class Client {
  /** Where the service is and who calls it. */
  readonly endpoint: Endpoint;

  constructor(options: ClientOptions = {}) {
    const key = options.key ?? process.env.AGENTBOX_KEY;
    if (!key) {
      throw new Error("no API key: pass key or set AGENTBOX_KEY (agentbox serve keys add NAME)");
    }
    const socket = options.socket ?? (process.env.AGENTBOX_SOCKET || undefined);
    this.endpoint = {
      url: (options.url ?? process.env.AGENTBOX_URL ?? DEFAULT_URL).replace(/\/+$/, ""),
      socket,
      key,
      timeoutMs: options.timeoutMs ?? 600_000,
      tls: options.tls,
    };
  }

  /** @internal */
  async call<T>(req: Req): Promise<T> {
    const a = await send(this.endpoint, req);
    return (a.body.length ? JSON.parse(a.body.toString("utf8")) : undefined) as T;
  }

  /** @internal */
  async bytes(req: Req): Promise<Buffer> {
    return (await send(this.endpoint, req)).body;
  }

  /** @internal */
  stream(path: string, after: number): Promise<Stream> {
    return Stream.open(this.endpoint, path, after);
  }

  /** The providers: whether this server can make their boxes, what each honours. */
  providers(): Promise<ProviderInfo[]> {
    return this.call({ method: "GET", path: "/v1/providers" });
  }

  /** The agent's tools, with their argument schemas. */
  tools(): Promise<ToolInfo[]> {
    return this.call({ method: "GET", path: "/v1/tools" });
  }

  /** Make a box; a spec field the provider cannot honour is refused (`unsupported`). */
  async createBox(o: { provider?: string; spec?: Spec } = {}): Promise<Box> {
    const spec = { max_lifetime_ms: 3_600_000, ...o.spec };
    const info = await this.call<BoxInfo>({
      method: "POST",
      path: "/v1/boxes",
      json: { spec, ...(o.provider ? { provider: o.provider } : {}) },
    });
    return new Box(this, info);
  }

  /** The box called `name` (this key's own): made from the spec, or found and woken. */
  async openBox(o: { name: string; provider?: string; spec?: Spec }): Promise<Box> {
    const spec = { max_lifetime_ms: 3_600_000, ...o.spec };
    const info = await this.call<BoxInfo>({
      method: "POST",
      path: "/v1/boxes/open",
      json: { name: o.name, spec, ...(o.provider ? { provider: o.provider } : {}) },
    });
    return new Box(this, info);
  }

  /** The box `id` (`provider:name`); `not_found` for another key's. */
  async getBox(id: string): Promise<Box> {
    return new Box(this, await this.call<BoxInfo>({ method: "GET", path: box(id) }));
  }

  /** The boxes this key owns, of one provider or all, with all of `labels`. */
  async listBoxes(o: { provider?: string; labels?: Record<string, string> } = {}): Promise<Box[]> {
    const labels = Object.entries(o.labels ?? {})
      .map(([k, v]) => `${k}=${v}`)
      .join(",");
    const infos = await this.call<BoxInfo[]>({
      method: "GET",
      path: "/v1/boxes",
      query: { provider: o.provider, labels: labels || undefined },
    });
    return infos.map((i) => new Box(this, i));
  }

  /** This key's snapshots, of one provider or all. */
  snapshots(provider?: string): Promise<SnapshotInfo[]> {
    return this.call({ method: "GET", path: "/v1/snapshots", query: { provider } });
  }

  /** Delete one of this key's snapshots; `not_found` when there is none. */
  async deleteSnapshot(provider: string, name: string): Promise<void> {
    await this.call({
      method: "DELETE",
      path: `/v1/snapshots/${encodeURIComponent(provider)}/${encodeURIComponent(name)}`,
    });
  }

  /** This host's runs (an admin key's alone). */
  runs(): Promise<Record<string, unknown>[]> {
    return this.call({ method: "GET", path: "/v1/runs" });
  }

  /** One run's record: its status, generation and holder. */
  run(id: string): Promise<Record<string, unknown>> {
    return this.call({ method: "GET", path: `/v1/runs/${encodeURIComponent(id)}` });
  }

  /** A run's tool calls, in order. */
  runLedger(id: string): Promise<Record<string, unknown>[]> {
    return this.call({ method: "GET", path: `/v1/runs/${encodeURIComponent(id)}/ledger` });
  }

  /** The tool calls that acted on a target (a path or a box), newest first. */
  ledger(target: string, limit?: number): Promise<Record<string, unknown>[]> {
    return this.call({ method: "GET", path: "/v1/ledger", query: { target, limit } });
  }

  /** What boxes cost: the receipts' totals by provider and kind. */
  receipts(): Promise<
    Array<{ provider: string; kind: string; boxes: number; seconds: number; cost_usd: number }>
  > {
    return this.call({ method: "GET", path: "/v1/receipts" });
  }
}

/** What to run: a program and its arguments, or a shell command. */
export type Program = { argv: string[]; command?: never } | { command: string; argv?: never };

/** One box, reached through its client. */
export class Box {
  /** What the service said of it last. */
  info: BoxInfo;
  readonly client: Client;

  constructor(client: Client, info: BoxInfo) {
    this.client = client;
    this.info = info;
  }

  /** Its id, `provider:name`. */
  get id(): string {
    return this.info.id;
  }

  /** Ask again: its facts, labels and status. */
  async refresh(): Promise<BoxInfo> {
    this.info = await this.client.call<BoxInfo>({ method: "GET", path: box(this.id) });
    return this.info;
  }

  /** End it, with every program in it. */
  async delete(): Promise<void> {
    await this.client.call({ method: "DELETE", path: box(this.id) });
  }

  /** Put it to sleep: files kept, programs ended, its lifetime going on. */
  async sleep(): Promise<void> {
    await this.client.call({ method: "POST", path: `${box(this.id)}/sleep` });
  }

  /** Wake it. */
  async wake(): Promise<BoxInfo> {
    this.info = await this.client.call<BoxInfo>({ method: "POST", path: `${box(this.id)}/wake` });
    return this.info;
  }

  /** Move its deadline: `byMs` from where it is, or to `endsAtMs`. */
  async extend(o: { byMs?: number; endsAtMs?: number }): Promise<BoxInfo> {
    const json = o.byMs !== undefined ? { by_ms: o.byMs } : { ends_at_ms: o.endsAtMs };
    this.info = await this.client.call<BoxInfo>({
      method: "POST",
      path: `${box(this.id)}/extend`,
      json,
    });
    return this.info;
  }

  /** Run one program to its end: its exit and its output, each up to `maxOutput` bytes. */
  exec(
    o: Program & {
      stdin?: string;
      env?: Record<string, string>;
      cwd?: string;
      timeoutMs?: number;
      maxOutput?: number;
    },
  ): Promise<ExecResult> {
    const json = {
      argv: o.argv,
      command: o.command,
      stdin: o.stdin,
      env: o.env,
      cwd: o.cwd,
      timeout_ms: o.timeoutMs,
      max_output: o.maxOutput,
    };
    return this.client.call({
      method: "POST",
      path: `${box(this.id)}/exec`,
      json,
      timeoutMs: (o.timeoutMs ?? 600_000) + MARGIN_MS,
    });
  }

  /** A file's bytes. */
  readFile(path: string): Promise<Buffer> {
    return this.client.bytes({ method: "GET", path: `${box(this.id)}/files`, query: { path } });
  }

  /** Write a file whole (its parents made). */
  async writeFile(path: string, data: string | Uint8Array): Promise<void> {
    await this.client.call({
      method: "PUT",
      path: `${box(this.id)}/files`,
      query: { path },
      body: data,
    });
  }

  /** What a path is (a link not followed). */
  stat(path: string): Promise<FileInfo> {
    return this.client.call({ method: "GET", path: `${box(this.id)}/files/stat`, query: { path } });
  }

  /** A directory's entries. */
  listDir(path: string): Promise<FileInfo[]> {
    return this.client.call({ method: "GET", path: `${box(this.id)}/files/list`, query: { path } });
  }

  /** Make a directory (and its parents, with `recursive`). */
  async mkdir(path: string, recursive = false): Promise<void> {
    await this.client.call({
      method: "POST",
      path: `${box(this.id)}/files/mkdir`,
      json: { path, recursive },
    });
  }

  /** Rename a path. */
  async rename(from: string, to: string): Promise<void> {
    await this.client.call({
      method: "POST",
      path: `${box(this.id)}/files/rename`,
      json: { from, to },
    });
  }

  /** Remove a file, a link or a directory (`recursive` for one with entries). */
  async remove(path: string, recursive = false): Promise<void> {
    await this.client.call({
      method: "DELETE",
      path: `${box(this.id)}/files`,
      query: { path, recursive },
    });
  }

  /** Unpack a tar into the directory `path`, through the server's safe extractor. */
  uploadTar(path: string, tar: Uint8Array): Promise<Unpacked> {
    return this.client.call({
      method: "PUT",
      path: `${box(this.id)}/archive`,
      query: { path },
      body: tar,
    });
  }

  /** The directory `path`'s contents as a tar. */
  downloadTar(path: string): Promise<Buffer> {
    return this.client.bytes({ method: "GET", path: `${box(this.id)}/archive`, query: { path } });
  }

  /** Each path under the directory `path` with its kind, size, mode and mtime (links not followed). */
  listing(path: string): Promise<Listing> {
    return this.client.call({
      method: "GET",
      path: `${box(this.id)}/archive/listing`,
      query: { path },
    });
  }

  /** The files and directories `names` (relative to the directory `path`) as a tar. */
  pick(path: string, names: string[]): Promise<Buffer> {
    return this.client.bytes({
      method: "POST",
      path: `${box(this.id)}/archive/pick`,
      json: { path, names },
    });
  }

  /** Call one of the agent's tools (`bash`, `read`, `edit`...) on the box. */
  tool(name: string, args: Record<string, unknown>): Promise<ToolResult> {
    return this.client.call({
      method: "POST",
      path: `${box(this.id)}/tools/${encodeURIComponent(name)}`,
      json: args,
    });
  }

  /** Start a program detached: it outlives this call and this client. */
  async start(
    o: Program & {
      env?: Record<string, string>;
      cwd?: string;
      timeoutMs?: number;
      tty?: { rows: number; cols: number };
    },
  ): Promise<Process> {
    const json = {
      argv: o.argv,
      command: o.command,
      env: o.env,
      cwd: o.cwd,
      timeout_ms: o.timeoutMs,
      tty: o.tty,
    };
    const started = await this.client.call<{ handle: number }>({
      method: "POST",
      path: `${box(this.id)}/processes`,
      json,
    });
    return new Process(this, started.handle);
  }

  /** The process `handle` of this box, reached again. */
  process(handle: number): Process {
    return new Process(this, handle);
  }

  /** The box's processes, running and ended. */
  processes(): Promise<Array<Record<string, unknown>>> {
    return this.client.call({ method: "GET", path: `${box(this.id)}/processes` });
  }

  /** A program in a terminal (a login shell unless `command`), started detached and streamed. */
  terminal(
    o: { rows?: number; cols?: number; command?: string; cwd?: string } = {},
  ): Promise<Stream> {
    const q = new URLSearchParams({ rows: String(o.rows ?? 24), cols: String(o.cols ?? 80) });
    if (o.command !== undefined) q.set("command", o.command);
    if (o.cwd !== undefined) q.set("cwd", o.cwd);
    return this.client.stream(`${box(this.id)}/terminal?${q}`, 0);
  }

  /** Keep its files under `name` (this key's own name). */
  snapshot(name: string): Promise<SnapshotInfo> {
    return this.client.call({ method: "POST", path: `${box(this.id)}/snapshots`, json: { name } });
  }

  /** `n` new boxes holding its files as they are now, owned by this key. */
  async fork(n = 1, spec: Spec = {}): Promise<Box[]> {
    const infos = await this.client.call<BoxInfo[]>({
      method: "POST",
      path: `${box(this.id)}/fork`,
      json: { n, spec: { max_lifetime_ms: 3_600_000, ...spec } },
    });
    return infos.map((i) => new Box(this.client, i));
  }
}

/** A detached process of a box, by its handle. */
export class Process {
  readonly box: Box;
  readonly handle: number;

  constructor(b: Box, handle: number) {
    this.box = b;
    this.handle = handle;
  }

  /** Its output from byte `after` on, waiting up to `waitMs` for some. */
  async output(o: { after?: number; waitMs?: number; maxBytes?: number } = {}): Promise<Output> {
    const wait = o.waitMs ?? 0;
    const read = await this.box.client.call<{
      chunks: Array<{ seq: number; stream: "stdout" | "stderr"; data: string }>;
      next: number;
      gap_from?: number;
      exit?: ProcessState;
    }>({
      method: "GET",
      path: `${proc(this.box.id, this.handle)}/output`,
      query: { after: o.after ?? 0, wait_ms: wait, max_bytes: o.maxBytes },
      timeoutMs: wait + MARGIN_MS,
    });
    const chunks = read.chunks.map((c) => {
      const data = Buffer.from(c.data, "base64");
      return { seq: c.seq, stream: c.stream, data, text: data.toString("utf8") };
    });
    return { ...read, chunks };
  }

  /** Its output live from byte `after` on, with its stdin, size and signals. */
  stream(after = 0): Promise<Stream> {
    return this.box.client.stream(
      `${proc(this.box.id, this.handle)}/stream?after=${Math.trunc(after)}`,
      after,
    );
  }

  /** Write to its stdin (and end it, with `close`). */
  async write(data: string, close = false): Promise<void> {
    await this.box.client.call({
      method: "POST",
      path: `${proc(this.box.id, this.handle)}/stdin`,
      json: { data, close },
    });
  }

  /** Signal its group: a number or a name (`TERM`, `KILL`, `INT`...). */
  async signal(sig: number | string = "TERM"): Promise<void> {
    await this.box.client.call({
      method: "POST",
      path: `${proc(this.box.id, this.handle)}/signal`,
      json: { signal: sig },
    });
  }

  /** Set the size of its terminal. */
  async resize(rows: number, cols: number): Promise<void> {
    await this.box.client.call({
      method: "POST",
      path: `${proc(this.box.id, this.handle)}/resize`,
      json: { rows, cols },
    });
  }

  /** How it ended; `timeout` past `timeoutMs`. */
  wait(timeoutMs = 60_000): Promise<ProcessState> {
    return this.box.client.call({
      method: "POST",
      path: `${proc(this.box.id, this.handle)}/wait`,
      json: { timeout_ms: timeoutMs },
      timeoutMs: timeoutMs + MARGIN_MS,
    });
  }

  /** Let the box forget it (once it ended). */
  async forget(): Promise<void> {
    await this.box.client.call({ method: "DELETE", path: proc(this.box.id, this.handle) });
  }
}
