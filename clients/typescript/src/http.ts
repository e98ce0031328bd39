/**
 * Requests to the service over TCP (http or https) or a unix socket, with Node's own `http`
 * (Node 20's fetch cannot dial a unix socket). Each has a deadline; a failure is an
 * `AgentboxError`.
 */
import * as http from "node:http";
import * as https from "node:https";

import { AgentboxError, errorOf } from "./errors.js";

/** Where the service is, and who calls it. */
export interface Endpoint {
  /** `http://host:port` or `https://host:port` (ignored with `socket`). */
  url: string;
  /** A unix socket's path, instead of `url`. */
  socket?: string | undefined;
  /** The API key. */
  key: string;
  /** Milliseconds a request may take unless it says otherwise. */
  timeoutMs: number;
  /** Extra TLS options for https (a CA, say). */
  tls?: https.AgentOptions | undefined;
}

/** One request. */
export interface Req {
  method: string;
  path: string;
  query?: Record<string, string | number | boolean | undefined> | undefined;
  json?: unknown;
  body?: Uint8Array | string | undefined;
  /** Milliseconds this one may take (an exec's own timeout, and a margin). */
  timeoutMs?: number | undefined;
}

/** What came back. */
export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** Milliseconds a long call's request may take past what the call itself was given. */
export const MARGIN_MS = 60_000;

/** The path with its query. */
export function pathOf(req: Pick<Req, "path" | "query">): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(req.query ?? {})) {
    if (v !== undefined) q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${req.path}?${s}` : req.path;
}

/** Send `req`; a failed answer throws the service's error. */
export async function send(to: Endpoint, req: Req): Promise<Answer> {
  const answer = await raw(to, req);
  if (answer.status >= 400) {
    const retry = answer.headers["retry-after"];
    throw errorOf(
      answer.status,
      answer.body.toString("utf8"),
      Array.isArray(retry) ? retry[0] : retry,
      `${req.method} ${req.path}`,
    );
  }
  return answer;
}

/** Send `req` and return whatever came back. */
export function raw(to: Endpoint, req: Req): Promise<Answer> {
  const what = `${req.method} ${req.path}`;
  let payload: Buffer | undefined;
  const headers: Record<string, string> = { authorization: `Bearer ${to.key}` };
  if (req.json !== undefined) {
    payload = Buffer.from(JSON.stringify(req.json));
    headers["content-type"] = "application/json";
  } else if (req.body !== undefined) {
    payload = Buffer.from(req.body);
    headers["content-type"] = "application/octet-stream";
  }
  if (payload) headers["content-length"] = String(payload.length);
  const target = new URL(to.url);
  const secure = !to.socket && target.protocol === "https:";
  const options: https.RequestOptions = {
    method: req.method,
    path: pathOf(req),
    headers,
    ...(to.socket
      ? { socketPath: to.socket }
      : { host: target.hostname, port: target.port || (secure ? 443 : 80) }),
    ...(secure ? to.tls : {}),
  };
  const timeout = req.timeoutMs ?? to.timeoutMs;
  return new Promise((resolve, reject) => {
    const r = (secure ? https : http).request(options, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
      );
      res.on("error", (e) =>
        reject(new AgentboxError("transfer_failed", `${what}: ${e.message}`, 0)),
      );
    });
    r.setTimeout(timeout, () => {
      r.destroy(new AgentboxError("timeout", `${what}: no answer within ${timeout} ms`, 0));
    });
    r.on("error", (e) =>
      reject(
        e instanceof AgentboxError
          ? e
          : new AgentboxError("transfer_failed", `${what}: ${e.message}`, 0),
      ),
    );
    if (payload) r.write(payload);
    r.end();
  });
}
