/**
 * A service of one's own: `agentbox serve` started on a private unix socket (mode 0600, in a
 * directory only this user reads), with a key made for it, when no server is named. A laptop
 * then needs only the `agentbox` binary.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import { Client } from "./client.js";
import { AgentboxError } from "./errors.js";

/** How to start the service. */
export interface LocalOptions {
  /** The `agentbox` binary (default `AGENTBOX_BIN`, else `agentbox` on the PATH). */
  bin?: string;
  /** Its arguments after `serve` (`--provider docker`, say). */
  args?: string[];
  /** Milliseconds to wait for it to serve (default 60,000). */
  startMs?: number;
  /**
   * A directory (made, mode 0700) that keeps the key store and its key between starts, so the
   * boxes one start made are this key's again at the next (a named box found by `openBox`).
   * Without it, each start has a key store of its own, removed by `close`.
   */
  keep?: string;
}

/** A client of a service this process started, which `close` stops. */
export class LocalClient extends Client {
  private readonly child: ChildProcess;
  private readonly dir: string;

  private constructor(socket: string, key: string, child: ChildProcess, dir: string) {
    super({ socket, key });
    this.child = child;
    this.dir = dir;
  }

  /**
   * Start `agentbox serve` on a socket of its own and a key store of its own.
   *
   * ```ts
   * const c = await LocalClient.start();
   * try { ... } finally { await c.close(); }
   * ```
   */
  static async start(o: LocalOptions = {}): Promise<LocalClient> {
    const bin = o.bin ?? process.env.AGENTBOX_BIN ?? "agentbox";
    const dir = mkdtempSync(join(tmpdir(), "agentbox-client-"));
    if (o.keep) mkdirSync(o.keep, { recursive: true, mode: 0o700 });
    const keys = join(o.keep ?? dir, "keys.db");
    const kept = o.keep ? join(o.keep, "key") : undefined;
    const socket = join(dir, "agentbox.sock");
    let key: string;
    try {
      if (kept && existsSync(kept)) {
        key = readFileSync(kept, "utf8").trim();
      } else {
        // A name of its own: two first starts at once each add a key, and the first kept wins.
        const made = await promisify(execFile)(bin, [
          "serve",
          "keys",
          "add",
          `local-${randomBytes(4).toString("hex")}`,
          "--admin",
          "--keys",
          keys,
        ]);
        key = made.stdout.trim();
        if (kept) {
          // Written whole beside its place, then linked in: a reader never sees half a key.
          const tmp = `${kept}.${process.pid}.${randomBytes(4).toString("hex")}`;
          writeFileSync(tmp, `${key}\n`, { mode: 0o600 });
          try {
            linkSync(tmp, kept);
          } catch (e) {
            if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
            key = readFileSync(kept, "utf8").trim();
          } finally {
            unlinkSync(tmp);
          }
        }
      }
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      throw new AgentboxError(
        "unknown",
        `starting ${bin} serve keys add: ${(e as Error).message}`,
        0,
      );
    }
    const child = spawn(bin, ["serve", "--socket", socket, "--keys", keys, ...(o.args ?? [])], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    const wait = o.startMs ?? 60_000;
    const served = new Promise<void>((resolve, reject) => {
      let said = "";
      const timer = setTimeout(() => {
        child.kill();
        reject(
          new AgentboxError("timeout", `${bin} serve did not serve within ${wait} ms: ${said}`, 0),
        );
      }, wait);
      child.stderr?.on("data", (c: Buffer) => {
        said += c.toString();
        if (said.includes("serving on unix:")) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.once("error", (e) => {
        clearTimeout(timer);
        reject(new AgentboxError("unknown", `starting ${bin} serve: ${e.message}`, 0));
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(
          new AgentboxError("unknown", `${bin} serve ended (${code}) before it served: ${said}`, 0),
        );
      });
    });
    try {
      await served;
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      throw e;
    }
    // Its log is read (and dropped) so it never blocks on a full pipe.
    child.stderr?.resume();
    return new LocalClient(socket, key, child, dir);
  }

  /** Stop the service (SIGTERM: it finishes what is in flight) and remove its socket and keys. */
  async close(): Promise<void> {
    // Still running: neither an exit code nor the signal that ended it.
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const ended = new Promise((r) => this.child.once("exit", r));
      this.child.kill("SIGTERM");
      await ended;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
