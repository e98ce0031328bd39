// The reference TypeScript client's runner-box.ts with its types removed
// and nothing else changed (runnerScript, which reads the TypeScript runner's bundle, is left
// out): the client our runner must serve unchanged.
import { FILE, frame, RUNNER_HEALTH, STDERR, STDIN, unframe } from "./runner-protocol.mjs";

export const runnerHealth = (url, headers) =>
  fetch(`${url}${RUNNER_HEALTH}`, { headers, signal: AbortSignal.timeout(5_000) })
    .then(async (res) => {
      const health = res.ok ? (await res.json()) : null;
      return typeof health?.protocol === "number" && typeof health.pid === "number"
        ? { protocol: health.protocol, pid: health.pid }
        : undefined;
    })
    .catch(() => undefined);

const encoder = new TextEncoder();

const ignore = () => {};

const OPEN_MS = 30_000;

export function runnerBox({ url, headers, id }) {
  const where = `the runner at ${new URL(url).host}`;
  let current;
  let last = 0;

  const connect = () => (current ??= open());
  function open() {
    const opening = new Promise((resolve, reject) => {
      const ws = new WebSocket(url.replace(/^http/, "ws"), { headers });
      ws.binaryType = "arraybuffer";
      const connection = { ws, waiting: new Map() };
      const late = setTimeout(() => ws.close(), OPEN_MS);
      ws.addEventListener("open", () => {
        clearTimeout(late);
        resolve(connection);
      });
      ws.addEventListener("message", ({ data }) => {
        try {
          if (typeof data !== "string") {
            const { id: of, stream, bytes } = unframe(new Uint8Array(data));
            return connection.waiting.get(of)?.bytes(stream, bytes);
          }
          const answer = JSON.parse(data);
          if (answer.id !== undefined) connection.waiting.get(answer.id)?.answer(answer);
        } catch {
          // A frame that is not the protocol's (another runner's) is dropped.
        }
      });
      ws.addEventListener("close", ({ code, reason }) => {
        clearTimeout(late);
        if (current === opening) current = undefined;
        reject(new Error(`${where} closed the connection (${reason || code})`));
        for (const waiter of connection.waiting.values()) waiter.lost();
        connection.waiting.clear();
      });
    });
    return opening;
  }

  async function ask(request, bytes) {
    const { ws, waiting } = await connect();
    const n = ++last;
    return new Promise((resolve, reject) => {
      const settle = (done) => {
        waiting.delete(n);
        done();
      };
      waiting.set(n, {
        bytes: (_, file) => settle(() => resolve(file)),
        answer: (answer) =>
          settle(() =>
            answer.op === "error"
              ? reject(new Error(`${where}: ${answer.message}`))
              : resolve(answer.op === "absent" ? null : undefined),
          ),
        lost: () => reject(new Error(`${where} closed the connection`)),
      });
      ws.send(JSON.stringify({ ...request, id: n }));
      if (bytes) ws.send(frame(n, FILE, bytes));
    });
  }

  return {
    id,
    async run(command, { cwd, env, stdin = false, signal } = {}) {
      const { ws, waiting } = await connect();
      const n = ++last;
      const stdout = new TransformStream();
      const stderr = new TransformStream();
      const out = stdout.writable.getWriter();
      const err = stderr.writable.getWriter();
      const exited = new Promise((done) => {
        const end = (exitCode) => {
          waiting.delete(n);
          out.close().catch(ignore);
          err.close().catch(ignore);
          done({ exitCode });
        };
        waiting.set(n, {
          bytes: (stream, bytes) => void (stream === STDERR ? err : out).write(bytes).catch(ignore),
          answer(answer) {
            if (answer.op === "exit") return end(answer.code);
            if (answer.op !== "error") return;
            err.write(encoder.encode(`${where}: ${answer.message}\n`)).catch(ignore);
            end(127);
          },
          lost: () => end(255),
        });
      });
      ws.send(JSON.stringify({ op: "run", id: n, command, cwd, env, stdin }));
      const kill = (sig = "SIGKILL") => {
        if (waiting.has(n)) ws.send(JSON.stringify({ op: "kill", id: n, signal: sig }));
      };
      const onAbort = () => kill();
      if (signal?.aborted) onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      void exited.then(() => signal?.removeEventListener("abort", onAbort));
      const endInput = () => void ws.send(JSON.stringify({ op: "stdin-end", id: n }));
      return {
        stdin: new WritableStream({
          write(bytes) {
            if (!stdin) throw new Error("its stdin is closed: run it with stdin: true");
            ws.send(frame(n, STDIN, bytes));
          },
          close: endInput,
          abort: endInput,
        }),
        stdout: stdout.readable,
        stderr: stderr.readable,
        wait: () => exited,
        kill,
      };
    },
    read: async (path) => (await ask({ op: "read", path })) ?? null,
    async write(path, bytes, { mode } = {}) {
      await ask({ op: "write", path, mode }, bytes);
    },
    async stop() {
      const closing = connect();
      try {
        await ask({ op: "stop" });
      } finally {
        if (current === closing) current = undefined;
        (await closing.catch(() => undefined))?.ws.close();
      }
    },
  };
}
