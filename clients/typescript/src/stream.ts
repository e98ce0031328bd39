/**
 * Live streams over WebSockets (the `ws` package: Node 20 has no WebSocket of its own): a
 * process's output as it comes, from a byte cursor, with its stdin, terminal size and signals
 * on the same socket. A stream that drops is opened again from its `next` cursor and loses
 * nothing the box still keeps (a `gap` event says what it lost).
 */
import WebSocket from "ws";

import { AgentboxError, errorOf } from "./errors.js";
import type { Endpoint } from "./http.js";
import type { ProcessState, StreamEvent } from "./models.js";

/** The largest message read: an output message is at most 256 KiB of bytes, base64'd. */
const MAX_MESSAGE = 4 << 20;

function wsUrl(to: Endpoint, path: string): string {
  if (to.socket) return `ws+unix://${to.socket}:${path}`;
  const u = new URL(to.url);
  return `${u.protocol === "https:" ? "wss:" : "ws:"}//${u.host}${path}`;
}

function event(raw: string): StreamEvent {
  const m = JSON.parse(raw) as Record<string, unknown>;
  switch (m.type) {
    case "output": {
      const data = Buffer.from(String(m.data), "base64");
      return {
        type: "output",
        seq: Number(m.seq),
        stream: m.stream === "stderr" ? "stderr" : "stdout",
        data,
        text: data.toString("utf8"),
      };
    }
    case "gap":
      return { type: "gap", from: Number(m.from), to: Number(m.to) };
    case "exit":
      return { type: "exit", exit: m.exit as ProcessState, next: Number(m.next) };
    case "started":
      return { type: "started", handle: Number(m.handle) };
    default:
      return { type: "error", code: String(m.code ?? "unknown"), message: String(m.message ?? "") };
  }
}

/**
 * A live stream. Iterate it (`for await`) for events until the program ends or the socket
 * drops; `next` is then the cursor to reopen from. Breaking out of a loop leaves it open (a
 * later loop goes on from there); `close` it when done.
 *
 * ```ts
 * const s = await proc.stream();
 * for await (const ev of s) if (ev.type === "output") process.stdout.write(ev.text);
 * ```
 */
export class Stream implements AsyncIterable<StreamEvent> {
  /** Where a reopened stream starts: past the last byte read. */
  next: number;
  /** How the program ended, once the `exit` event came. */
  exit: ProcessState | undefined;
  /** A terminal's process handle, once the `started` event came. */
  handle: number | undefined;
  private readonly ws: WebSocket;
  private readonly queue: StreamEvent[] = [];
  private waiting: ((v: IteratorResult<StreamEvent>) => void) | undefined;
  private failed: ((e: Error) => void) | undefined;
  private ended = false;
  private error: Error | undefined;

  private constructor(ws: WebSocket, after: number) {
    this.ws = ws;
    this.next = after;
    ws.on("message", (data: WebSocket.RawData) => this.push(event(data.toString())));
    ws.on("close", () => this.finish());
    ws.on("error", (e: Error) => {
      this.error = new AgentboxError("transfer_failed", `a stream: ${e.message}`, 0);
      this.finish();
    });
  }

  /** Open the stream at `path`, whose first byte is `after`. */
  static open(to: Endpoint, path: string, after: number): Promise<Stream> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl(to, path), {
        headers: { authorization: `Bearer ${to.key}` },
        maxPayload: MAX_MESSAGE,
        handshakeTimeout: to.timeoutMs,
        ...(to.tls ?? {}),
      });
      ws.once("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const retry = res.headers["retry-after"];
          reject(
            errorOf(
              res.statusCode ?? 0,
              Buffer.concat(chunks).toString("utf8"),
              Array.isArray(retry) ? retry[0] : retry,
              `GET ${path}`,
            ),
          );
        });
      });
      ws.once("open", () => resolve(new Stream(ws, after)));
      ws.once("error", (e: Error) =>
        reject(new AgentboxError("transfer_failed", `GET ${path}: ${e.message}`, 0)),
      );
    });
  }

  private push(ev: StreamEvent): void {
    if (ev.type === "output") this.next = ev.seq + ev.data.length;
    else if (ev.type === "gap") this.next = ev.to;
    else if (ev.type === "exit") {
      this.next = ev.next;
      this.exit = ev.exit;
    } else if (ev.type === "started") this.handle = ev.handle;
    const w = this.waiting;
    if (w) {
      this.waiting = undefined;
      this.failed = undefined;
      w({ value: ev, done: false });
    } else this.queue.push(ev);
  }

  private finish(): void {
    if (this.ended) return;
    this.ended = true;
    const [w, f] = [this.waiting, this.failed];
    this.waiting = undefined;
    this.failed = undefined;
    if (this.error && f) f(this.error);
    else if (w) w({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamEvent> {
    return {
      next: () => {
        const ev = this.queue.shift();
        if (ev) return Promise.resolve({ value: ev, done: false });
        if (this.ended) {
          return this.error
            ? Promise.reject(this.error)
            : Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve, reject) => {
          this.waiting = resolve;
          this.failed = reject;
        });
      },
      // Leaving a `for await` loop leaves the stream open, to be iterated again (the next
      // loop goes on where this one stopped) or closed with `close`.
      return: () => Promise.resolve({ value: undefined, done: true }),
    };
  }

  private send(message: unknown): void {
    this.ws.send(JSON.stringify(message));
  }

  /** Write to the program's stdin (and end it, with `close`). */
  write(data: string | Uint8Array, close = false): void {
    if (typeof data === "string") this.send({ type: "stdin", data, close });
    else this.send({ type: "stdin", data_base64: Buffer.from(data).toString("base64"), close });
  }

  /** Set its terminal's size. */
  resize(rows: number, cols: number): void {
    this.send({ type: "resize", rows, cols });
  }

  /** Signal its group: a number or a name (`INT`, `TERM`...). */
  signal(sig: number | string): void {
    this.send({ type: "signal", signal: sig });
  }

  /** Close the socket (the program runs on). */
  close(): void {
    this.ws.close();
  }
}
