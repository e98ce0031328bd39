/**
 * A client of `agentbox serve`: sandboxes for AI agents over every provider agentbox has.
 *
 * ```ts
 * import { Client } from "@agentbox/client";
 * const c = new Client({ key: process.env.AGENTBOX_KEY });
 * const box = await c.createBox({ provider: "namespace", spec: { max_lifetime_ms: 600_000 } });
 * console.log((await box.exec({ command: "uname -a" })).stdout);
 * await box.delete();
 * ```
 */
export { Box, Client, type ClientOptions, DEFAULT_URL, Process, type Program } from "./client.js";
export { AgentboxError } from "./errors.js";
export { LocalClient, type LocalOptions } from "./local.js";
export type * from "./models.js";
export { Stream } from "./stream.js";
export { type Mark, type MarkEntry, type Pulled, pull, type Seeded, seed } from "./sync.js";
export { packDir, unpack } from "./tar.js";
