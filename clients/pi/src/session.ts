/**
 * One pi session's box: made (or found and woken) by name, the working directory seeded into
 * it at the same path, what it changes pulled back after each turn, and its loss said in one
 * line, never papered over by running anything on this machine.
 */
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";

import {
  AgentboxError,
  type Box,
  Client,
  LocalClient,
  type Mark,
  pull,
  seed,
} from "@agentbox/client";

import { type AgentboxConfig, specOf } from "./config.js";

/** Paths a pull never brings back nor removes here (see `BoxSession.pullExclude`). */
export const NEVER_PULLED = [".git", ".pi"];

/** A call that cannot run because the box is gone (or the service no longer answers). */
export class BoxLost extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BoxLost";
  }
}

/** A box name from a session id: what `/resume` finds again. */
export function boxName(sessionId: string): string {
  const s = sessionId
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/^-+|-+$/g, "");
  return `pi-${s}`.slice(0, 60);
}

/** The box of one session, and the service that serves it. */
export class BoxSession {
  readonly config: AgentboxConfig;
  /** This machine's working directory, and the box's (the same path). */
  readonly cwd: string;
  readonly name: string;
  private readonly stateDir: string;
  private client: Client | undefined;
  private current: Box | undefined;
  private mark: Mark = {};
  private lostWhy: string | undefined;
  private pulling: Promise<unknown> = Promise.resolve();
  private renewing: Promise<Box> | undefined;

  constructor(config: AgentboxConfig, cwd: string, name: string, stateDir: string) {
    this.config = config;
    this.cwd = cwd;
    this.name = config.box ?? name;
    this.stateDir = stateDir;
  }

  /** The box, once `open` made it. */
  get box(): Box | undefined {
    return this.current;
  }

  /** Why the box is gone, when it is. */
  get lost(): string | undefined {
    return this.lostWhy;
  }

  /**
   * The provider: the config's, else namespace. Never the service's own default, which falls
   * back to a local box (this machine itself) where namespaces cannot be made: there the
   * session has no box, and says why, rather than run the tools here.
   */
  get provider(): string {
    return this.config.provider ?? "namespace";
  }

  private get markFile(): string {
    return join(this.stateDir, "marks", `${this.name}.json`);
  }

  private async service(): Promise<Client> {
    if (this.client) return this.client;
    const url = this.config.url ?? process.env.AGENTBOX_URL;
    if (url) {
      this.client = new Client({ url });
    } else {
      const args = ["--provider", this.provider];
      this.client = await LocalClient.start({
        bin: this.config.bin,
        args,
        keep: join(this.stateDir, "service"),
      });
    }
    return this.client;
  }

  /**
   * Make the box (or find it by name and wake it). A box this session had before comes back as
   * it is, its changes pulled here; a new one is seeded from here.
   */
  async open(): Promise<Box> {
    const b = await this.find();
    this.current = b;
    this.lostWhy = undefined;
    const kept = this.readMark();
    if (kept) {
      this.mark = kept;
      await this.pull();
    } else {
      const seeded = await seed(b, this.cwd, this.cwd, this.exclude());
      this.mark = seeded.mark;
      this.writeMark();
    }
    return b;
  }

  /**
   * The box named after the session: opened by name, or, on a provider whose boxes have no
   * names (E2B's), found by a label that says the name, and woken; made when there is none.
   */
  private async find(): Promise<Box> {
    const c = await this.service();
    const provider = { provider: this.provider };
    const spec = specOf(this.config);
    try {
      return await c.openBox({ name: this.name, spec, ...provider });
    } catch (e) {
      if (!(e instanceof AgentboxError) || e.code !== "unsupported") throw e;
    }
    const labels = { ...((spec.labels as Record<string, string>) ?? {}), "pi-box": this.name };
    const found = await c.listBoxes({ ...provider, labels });
    for (const b of found) {
      const info = await b.refresh();
      if (info.status === "sleeping") await b.wake();
      if (info.status !== "ended") return b;
    }
    return c.createBox({ ...provider, spec: { ...spec, labels } });
  }

  private exclude(): string[] {
    return this.config.exclude ?? [];
  }

  /**
   * What a pull never brings back nor removes here: the config's, and `.git` and `.pi`, whose
   * files run here unasked (a git hook, a git config's fsmonitor, a pi extension or config).
   */
  private pullExclude(): string[] {
    return [...this.exclude(), ...NEVER_PULLED];
  }

  /**
   * What makes this box this box: its id and when it started. A box made anew under the same
   * name has the same id and a new start; its mark is not the old one's (pulling an empty box
   * against the old mark would remove here what the old box had).
   */
  private identity(): string | undefined {
    const b = this.current;
    const started = b?.info.facts.started_at_ms;
    return b && typeof started === "number" ? `${b.id}@${started}` : undefined;
  }

  private readMark(): Mark | undefined {
    try {
      const kept = JSON.parse(readFileSync(this.markFile, "utf8")) as { box: string; mark: Mark };
      const me = this.identity();
      return me !== undefined && kept.box === me ? kept.mark : undefined;
    } catch {
      return undefined;
    }
  }

  private writeMark(): void {
    mkdirSync(join(this.stateDir, "marks"), { recursive: true, mode: 0o700 });
    const tmp = `${this.markFile}.${process.pid}`;
    const fd = openSync(tmp, "w", 0o600);
    try {
      writeSync(fd, JSON.stringify({ box: this.identity(), mark: this.mark }));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.markFile);
  }

  /** Bring back what the box changed since the last pull; never an edit made here. */
  pull(): Promise<string[]> {
    const run = async () => {
      const b = this.current;
      if (!b || this.lostWhy) return [];
      const pulled = await this.guard(() =>
        pull(b, this.cwd, this.cwd, this.mark, this.pullExclude()),
      );
      // A box renewed meanwhile has a mark of its own.
      if (this.current !== b) return [];
      this.mark = pulled.mark;
      this.writeMark();
      return pulled.hostChanged;
    };
    const next = this.pulling.then(run, run);
    this.pulling = next.catch(() => undefined);
    return next;
  }

  /** The box for a call, or the one line that says why there is none. */
  ready(): Box {
    if (this.lostWhy) throw new BoxLost(this.lostWhy);
    if (!this.current)
      throw new BoxLost("agentbox: no box yet (it is being made, or making it failed)");
    return this.current;
  }

  /**
   * Run `f` on the box. A failure that is the box's loss (it ended, its service went away) is
   * said in one line, and every call after it says the same until a new box is made.
   */
  async guard<T>(f: () => Promise<T>): Promise<T> {
    const b = this.ready();
    try {
      return await f();
    } catch (e) {
      const why = await this.lossOf(b, e);
      if (why) {
        this.lostWhy = why;
        throw new BoxLost(why);
      }
      throw e;
    }
  }

  private async lossOf(b: Box, e: unknown): Promise<string | undefined> {
    if (!(e instanceof AgentboxError)) return undefined;
    if (e.status === 0 && (e.code === "transfer_failed" || e.code === "timeout")) {
      return `agentbox: the service no longer answers (${e.reason}); nothing ran. /agentbox new makes a new box`;
    }
    // An ended box answers `gone` while the service still holds its handle, `not_found`
    // once it let go of it: either is asked again of the box itself.
    if (!["not_found", "gone", "unavailable"].includes(e.code)) return undefined;
    try {
      const info = await b.refresh();
      if (info.status !== "ended") return undefined;
    } catch (again) {
      if (!(again instanceof AgentboxError) || !["not_found", "gone"].includes(again.code)) {
        return undefined;
      }
    }
    return `agentbox: the box ${b.id} is gone (ended or lost); nothing ran. /agentbox new makes a new box`;
  }

  /** A new box in place of a lost one, seeded from here. */
  async renew(): Promise<Box> {
    this.renewing ??= (async () => {
      try {
        // A pull under way finishes first (and, the box gone, keeps nothing).
        this.current = undefined;
        await this.pulling;
        this.mark = {};
        // A service of the extension's own is started again: it may be what was lost.
        if (this.client instanceof LocalClient) {
          await this.client.close().catch(() => undefined);
          this.client = undefined;
        }
        // The same box, if it lives on (its service was what was lost), is pulled from, never
        // seeded over; a box made anew is seeded.
        return await this.open();
      } finally {
        this.renewing = undefined;
      }
    })();
    return this.renewing;
  }

  /** Milliseconds the box has left, when its provider says. */
  leftMs(): number | undefined {
    const ends = this.current?.info.facts.ends_at_ms;
    return typeof ends === "number" ? ends - Date.now() : undefined;
  }

  /** Leave: the last pull, then the box slept, kept or ended as the config says; the service stopped. */
  async close(): Promise<void> {
    try {
      if (this.current && !this.lostWhy) {
        await this.pull().catch(() => undefined);
        const how = this.config.onExit ?? "sleep";
        if (how === "end") await this.current.delete().catch(() => undefined);
        else if (how === "sleep") await this.current.sleep().catch(() => undefined);
      }
    } finally {
      if (this.client instanceof LocalClient) await this.client.close();
      this.client = undefined;
    }
  }
}
