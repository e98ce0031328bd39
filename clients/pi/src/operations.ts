/**
 * pi's pluggable operations over a box: pi's own read, write, edit and bash run unchanged
 * (their truncation, messages and details are pi's), with the file system and the shell the
 * box's. The box's paths are this machine's (the working directory is seeded at its own path),
 * so nothing is translated.
 */

import { AgentboxError, type Box } from "@agentbox/client";
import type {
  BashOperations,
  EditOperations,
  ReadOperations,
  WriteOperations,
} from "@mariozechner/pi-coding-agent";

import type { BoxSession } from "./session.js";

const ERRNO: Record<string, [string, string]> = {
  not_found: ["ENOENT", "no such file or directory"],
  permission_denied: ["EACCES", "permission denied"],
  not_directory: ["ENOTDIR", "not a directory"],
  is_directory: ["EISDIR", "illegal operation on a directory"],
};

/**
 * The error Node's own `fs` gives for the same failure, so pi's messages read as they do on
 * this machine (`ENOENT: no such file or directory, access '/p'`).
 */
export function nodeError(e: unknown, syscall: string, path: string): unknown {
  if (!(e instanceof AgentboxError)) return e;
  // A directory read as a file is `invalid` to the service, naming the OS's reason.
  const kind = e.code === "invalid" && /Is a directory/.test(e.message) ? "is_directory" : e.code;
  const errno = ERRNO[kind];
  if (!errno) return new Error(`agentbox: ${e.message}`);
  const [code, text] = errno;
  const message =
    code === "EISDIR" ? `${code}: ${text}, read` : `${code}: ${text}, ${syscall} '${path}'`;
  return Object.assign(new Error(message), { code, syscall, path });
}

/** The image types pi's read returns as images, by their first bytes. */
export function imageType(b: Buffer): string | null {
  if (b.length >= 8 && b.subarray(0, 8).equals(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]))) {
    return "image/png";
  }
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "image/jpeg";
  if (b.length >= 6 && /^GIF8[79]a$/.test(b.subarray(0, 6).toString("latin1"))) return "image/gif";
  if (
    b.length >= 12 &&
    b.subarray(0, 4).toString("latin1") === "RIFF" &&
    b.subarray(8, 12).toString("latin1") === "WEBP"
  ) {
    return "image/webp";
  }
  return null;
}

/**
 * A file read once per tool call: pi's read asks whether it may read, what type it is, and its
 * bytes; the box is asked once.
 */
function reader(s: BoxSession) {
  let last: { path: string; data: Buffer } | undefined;
  return async (path: string, syscall: string): Promise<Buffer> => {
    if (last?.path === path) return last.data;
    const box = s.ready();
    try {
      const data = await s.guard(() => box.readFile(path));
      last = { path, data };
      return data;
    } catch (e) {
      throw nodeError(e, syscall, path);
    }
  };
}

/** pi's read over the box (a fresh set per call: its one read is that call's). */
export function readOps(s: BoxSession): ReadOperations {
  const read = reader(s);
  return {
    access: async (p) => {
      await read(p, "access");
    },
    readFile: (p) => read(p, "open"),
    detectImageMimeType: async (p) => imageType(await read(p, "open")),
  };
}

async function write(s: BoxSession, path: string, content: string): Promise<void> {
  const box = s.ready();
  try {
    await s.guard(() => box.writeFile(path, content));
  } catch (e) {
    throw nodeError(e, "open", path);
  }
}

/** pi's write over the box (the box makes a file's parents as it writes it). */
export function writeOps(s: BoxSession): WriteOperations {
  return {
    mkdir: async () => {},
    writeFile: (p, content) => write(s, p, content),
  };
}

/** pi's edit over the box. */
export function editOps(s: BoxSession): EditOperations {
  const read = reader(s);
  return {
    access: async (p) => {
      await read(p, "access");
    },
    readFile: (p) => read(p, "open"),
    writeFile: (p, content) => write(s, p, content),
  };
}

/** Run `$1` with bash where the box has bash, else with sh. */
const BASH_OR_SH = 'command -v bash >/dev/null 2>&1 && exec bash -c "$1"; exec sh -c "$1"';

/**
 * pi's bash over the box: the command runs detached in the box, its output streamed to pi as
 * it comes (pi throttles its updates as it does for its own), stdin closed as pi's is. An
 * abort or a timeout kills the command's process group in the box. pi's environment is never
 * sent: the box's programs see the box's.
 */
export function bashOps(s: BoxSession): BashOperations {
  return {
    exec: async (command, cwd, { onData, signal, timeout }) => {
      const box: Box = s.ready();
      if (signal?.aborted) throw new Error("aborted");
      const seconds = timeout !== undefined && timeout > 0 ? timeout : undefined;
      const p = await s.guard(() =>
        box.start({
          // pi's bash is bash (the service's `command` is `sh -c`): bash where the box has it.
          argv: ["sh", "-c", BASH_OR_SH, "sh", command],
          cwd,
          // The box's own bound, past ours: a command never outlives a lost client by long.
          ...(seconds ? { timeoutMs: Math.ceil(seconds * 1000) + 5000 } : {}),
        }),
      );
      let aborted = false;
      let timedOut = false;
      const kill = () => {
        p.signal("KILL").catch(() => undefined);
      };
      const onAbort = () => {
        aborted = true;
        kill();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // An abort while it was starting: its event came before anyone listened.
      if (signal?.aborted) onAbort();
      const timer = seconds
        ? setTimeout(() => {
            timedOut = true;
            kill();
          }, seconds * 1000)
        : undefined;
      let exitCode: number | null = null;
      let ended = false;
      try {
        const stream = await s.guard(() => p.stream(0));
        try {
          stream.write("", true);
          for await (const ev of stream) {
            if (ev.type === "output") onData(Buffer.from(ev.data));
            else if (ev.type === "gap") {
              onData(
                Buffer.from(`\n[agentbox: ${ev.to - ev.from} bytes of output were dropped]\n`),
              );
            } else if (ev.type === "error") {
              // stdin closed after the command ended: its exit comes next.
              if (ev.code === "gone") continue;
              throw new Error(`agentbox: ${ev.code}: ${ev.message}`);
            } else if (ev.type === "exit") {
              if (ev.exit.state === "timed_out") timedOut = true;
              const st = ev.exit.status;
              exitCode = st && st.signal === undefined ? st.code : null;
              ended = true;
              break;
            }
          }
        } finally {
          stream.close();
        }
      } finally {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        // A command whose end was not seen (its stream failed) is not left running.
        if (!ended) kill();
        p.forget().catch(() => undefined);
      }
      if (aborted) throw new Error("aborted");
      if (timedOut) throw new Error(`timeout:${seconds}`);
      if (!ended) {
        await s.guard(() => box.refresh());
        throw new Error("agentbox: the command's stream ended before the command did");
      }
      return { exitCode };
    },
  };
}
