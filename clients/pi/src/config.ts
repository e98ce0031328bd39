/**
 * Where a pi session's box comes from: `~/.pi/agent/agentbox.json` (the user's), then
 * `.pi/agentbox.json` (the project's), then pi's flags, each over the one before.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** What a config file (or a flag) may say. */
export interface AgentboxConfig {
  /** The provider of the box (`namespace` unless said; `docker`, `e2b`, `kube`...). */
  provider?: string;
  /** The image (or rootfs) the box starts from. */
  image?: string;
  /** How long the box may live: `90m`, `2h`, `1h30m`, or seconds. Default `2h`. */
  lifetime?: string | number;
  /** What the box may reach: `open`, `none`, or a list of hosts and CIDRs (the allowlist). */
  network?: "open" | "none" | string[];
  /** Ports to expose: a number (https) or `{port, kind}`. */
  ports?: Array<number | { port: number; kind?: "https" | "tcp" }>;
  /** A box of this name is used (made, or found and woken) instead of one per session. */
  box?: string;
  /** Relative paths of the working directory never seeded nor pulled back. */
  exclude?: string[];
  /** What becomes of the box when pi leaves the session: `sleep` (default), `keep`, `end`. */
  onExit?: "sleep" | "keep" | "end";
  /** The service's URL (else `AGENTBOX_URL`; else a service of the extension's own). */
  url?: string;
  /** The `agentbox` binary for a service of the extension's own (else `AGENTBOX_BIN`, else PATH). */
  bin?: string;
  /** Any further field of agentbox's spec (`env`, `labels`, `isolation`...), as it is. */
  spec?: Record<string, unknown>;
}

const KEYS = new Set([
  "provider",
  "image",
  "lifetime",
  "network",
  "ports",
  "box",
  "exclude",
  "onExit",
  "url",
  "bin",
  "spec",
]);

/** A config that cannot be used: which file, which field, and why. */
export class ConfigError extends Error {
  constructor(where: string, message: string) {
    super(`agentbox: ${where}: ${message}`);
    this.name = "ConfigError";
  }
}

/** Milliseconds of a lifetime (`90m`, `2h`, `1h30m`, `45s`, or a number of seconds). */
export function lifetimeMs(v: string | number, where: string): number {
  if (typeof v === "number") {
    if (!Number.isFinite(v) || v <= 0)
      throw new ConfigError(where, `lifetime ${v}: not a positive number of seconds`);
    return Math.round(v * 1000);
  }
  const m = /^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$/.exec(v.trim());
  if (!m || v.trim() === "") {
    throw new ConfigError(
      where,
      `lifetime ${JSON.stringify(v)}: write it as 90m, 2h, 1h30m or 45s`,
    );
  }
  const ms = (Number(m[1] ?? 0) * 3600 + Number(m[2] ?? 0) * 60 + Number(m[3] ?? 0)) * 1000;
  if (ms <= 0) throw new ConfigError(where, `lifetime ${JSON.stringify(v)}: not positive`);
  return ms;
}

function check(raw: unknown, where: string): AgentboxConfig {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new ConfigError(where, "not a JSON object");
  }
  const o = raw as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    if (!KEYS.has(k)) throw new ConfigError(where, `${k}: not a field (${[...KEYS].join(", ")})`);
  }
  const str = (k: string) => {
    if (o[k] !== undefined && typeof o[k] !== "string")
      throw new ConfigError(where, `${k}: not a string`);
  };
  for (const k of ["provider", "image", "box", "url", "bin"]) str(k);
  if (o.lifetime !== undefined) {
    if (typeof o.lifetime !== "string" && typeof o.lifetime !== "number") {
      throw new ConfigError(where, "lifetime: a string (2h) or a number of seconds");
    }
    lifetimeMs(o.lifetime, where);
  }
  const n = o.network;
  if (
    n !== undefined &&
    n !== "open" &&
    n !== "none" &&
    !(Array.isArray(n) && n.every((x) => typeof x === "string"))
  ) {
    throw new ConfigError(where, 'network: "open", "none", or a list of hosts and CIDRs');
  }
  if (o.ports !== undefined) {
    const ok =
      Array.isArray(o.ports) &&
      o.ports.every(
        (p) =>
          (Number.isInteger(p) && p > 0 && p < 65536) ||
          (typeof p === "object" && p !== null && Number.isInteger((p as { port: unknown }).port)),
      );
    if (!ok) throw new ConfigError(where, "ports: a list of port numbers or {port, kind}");
  }
  if (
    o.exclude !== undefined &&
    !(Array.isArray(o.exclude) && o.exclude.every((x) => typeof x === "string"))
  ) {
    throw new ConfigError(where, "exclude: a list of relative paths");
  }
  if (o.onExit !== undefined && !["sleep", "keep", "end"].includes(o.onExit as string)) {
    throw new ConfigError(where, 'onExit: "sleep", "keep" or "end"');
  }
  if (
    o.spec !== undefined &&
    (typeof o.spec !== "object" || o.spec === null || Array.isArray(o.spec))
  ) {
    throw new ConfigError(where, "spec: an object of agentbox's spec fields");
  }
  return o as AgentboxConfig;
}

function readFile(path: string): AgentboxConfig {
  if (!existsSync(path)) return {};
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new ConfigError(path, `not JSON: ${(e as Error).message}`);
  }
  return check(raw, path);
}

/** The config of a session in `cwd`: the user's file, the project's over it, `flags` over both. */
export function loadConfig(
  cwd: string,
  agentDir: string,
  flags: AgentboxConfig = {},
): AgentboxConfig {
  const user = readFile(join(agentDir, "agentbox.json"));
  const project = readFile(join(cwd, ".pi", "agentbox.json"));
  const given = Object.fromEntries(Object.entries(flags).filter(([, v]) => v !== undefined));
  const merged = { ...user, ...project, ...check(given, "flags") };
  return merged;
}

/** The spec a config asks for: the contract's fields, from the config's own and its `spec`. */
export function specOf(c: AgentboxConfig): Record<string, unknown> {
  const spec: Record<string, unknown> = { ...(c.spec ?? {}) };
  spec.max_lifetime_ms = lifetimeMs(c.lifetime ?? "2h", "lifetime");
  if (c.image) spec.image = c.image;
  if (c.network) spec.network = Array.isArray(c.network) ? { allow: c.network } : c.network;
  if (c.ports) spec.ports = c.ports.map((p) => (typeof p === "number" ? { port: p } : p));
  return spec;
}
