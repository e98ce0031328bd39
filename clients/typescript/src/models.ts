/** The service's answers, as the OpenAPI document at `/v1/openapi.json` describes them. */

/** A provider, whether this server can make its boxes, and what it honours. */
export interface ProviderInfo {
  name: string;
  description: string;
  /** Built into this server. */
  compiled: boolean;
  /** This server can make its boxes. */
  available: boolean;
  /** Why it cannot, when it cannot. */
  why_not?: string;
  /** What it honours (sleep, snapshots, fork...), where it can be made. */
  honours?: Record<string, boolean>;
  /** A create that names no provider uses this one. */
  default: boolean;
}

/** A box as the service shows it. */
export interface BoxInfo {
  /** `provider:name`: the path of every call on it. */
  id: string;
  provider: string;
  labels: Record<string, string>;
  /** What it really got, as its provider says. */
  facts: Record<string, unknown> & { ends_at_ms?: number; started_at_ms?: number; name?: string };
  /** `running`, `sleeping` or `ended`, where asked (`Box.refresh`). */
  status?: "running" | "sleeping" | "ended";
}

/** A spec: every field of the contract's spec (`max_lifetime_ms`, `image`, `env`, `labels`...). */
export interface Spec {
  max_lifetime_ms?: number;
  image?: string;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  snapshot?: string;
  /**
   * Credentials the box uses without holding them: its `name` variable holds a placeholder and
   * the server's egress proxy puts the value into HTTPS requests to `hosts` alone. A server
   * gives only what `agentbox serve --secret` offers.
   */
  secrets?: Array<{ name: string; from: string; hosts: string[] }>;
  [field: string]: unknown;
}

/** What a program that ran to its end did. */
export interface ExecResult {
  exit_code: number;
  signal?: number;
  stdout: string;
  stderr: string;
  /** Bytes past the bound, not kept. */
  stdout_dropped: number;
  stderr_dropped: number;
}

/** What a path is. */
export interface FileInfo {
  name: string;
  path: string;
  kind: "file" | "directory" | "symlink" | string;
  size: number;
  mtime_ms?: number;
}

/** A tool's result, as pi's tools give it. */
export interface ToolResult {
  content: Array<
    { type: "text"; text: string } | { type: "image"; data: string; mimeType: string }
  >;
  details?: unknown;
  isError: boolean;
}

/** A tool the agent has: its name, description and argument schema. */
export interface ToolInfo {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
  read_only: boolean;
}

/** How a process stands: `{state: "running"}`, or ended with its status. */
export interface ProcessState {
  state: "running" | "exited" | "timed_out";
  status?: { code: number; signal?: number };
}

/** One chunk of a process's output. */
export interface Chunk {
  seq: number;
  stream: "stdout" | "stderr";
  data: Uint8Array;
  text: string;
}

/** One read of a process's output. */
export interface Output {
  chunks: Chunk[];
  /** The `after` of the next read. */
  next: number;
  /** Set when bytes from `after` on were lost: where the output goes on. */
  gap_from?: number;
  /** How it ended, once it ended and all was read. */
  exit?: ProcessState;
}

/** A snapshot, named as its key named it. */
export interface SnapshotInfo {
  name: string;
  provider: string;
  from?: string;
  created_at_ms?: number;
  bytes?: number;
  memory: boolean;
}

/** What a tar sent into a box did. */
export interface Unpacked {
  written: number;
  sent: number;
  skipped: Record<string, number>;
  skips: Array<{ path: string; reason: string; target?: string }>;
  masked: number;
}

/** One path of a box directory's listing. */
export interface ListedEntry {
  /** `f` file, `d` directory, `l` link, other letters as `find -printf %y` prints them. */
  kind: string;
  size: number;
  /** Permission bits, in octal. */
  mode: string;
  /** The box's mtime, as text: compare it, never read it as this machine's time. */
  mtime: string;
}

/** A box directory's listing, by relative path. */
export interface Listing {
  entries: Record<string, ListedEntry>;
}

/** One message of a live stream. */
export type StreamEvent =
  | { type: "output"; seq: number; stream: "stdout" | "stderr"; data: Uint8Array; text: string }
  | { type: "gap"; from: number; to: number }
  | { type: "exit"; exit: ProcessState; next: number }
  | { type: "started"; handle: number }
  | { type: "error"; code: string; message: string };
