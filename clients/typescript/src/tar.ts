/**
 * Tar, as far as a sync needs it: a directory of this machine packed (files and directories
 * only, links never followed), and an archive from the server unpacked without trusting it (no
 * member outside the destination, no link followed on the way in, each file renamed into place).
 */
import { createHash, randomBytes } from "node:crypto";
import {
  closeSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  type Stats,
  unlinkSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";

import { AgentboxError } from "./errors.js";

const BLOCK = 512;

/** A member name split into its segments, or `undefined` when it climbs, is absolute or empty. */
export function segments(name: string): string[] | undefined {
  const trimmed = name.replace(/^(\.\/)+/, "").replace(/\/+$/, "");
  if (!trimmed || trimmed.startsWith("/") || trimmed.includes("\0")) return undefined;
  const parts = trimmed.split("/");
  // `\` and `:` would be separators or drives to a Windows host.
  if (parts.some((p) => p === "" || p === "." || p === ".." || /[\\:]/.test(p))) return undefined;
  return parts;
}

function octal(n: number, width: number): string {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

function header(name: string, size: number, mode: number, mtime: number, type: string): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name, 0, 100, "utf8");
  h.write(octal(mode & 0o7777, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(size, 12), 124, "ascii");
  h.write(octal(Math.max(0, Math.floor(mtime)), 12), 136, "ascii");
  h.write("        ", 148, "ascii");
  h.write(type, 156, "ascii");
  h.write("ustar\u000000", 257, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7), 148, "ascii");
  return h;
}

/** A pax record `len path=value\n`, its length counting itself. */
function paxRecord(key: string, value: string): Buffer {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len += 1;
  return Buffer.from(`${len}${body}`);
}

function pad(n: number): Buffer {
  return Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK);
}

/** What packing a directory gave. */
export interface PackedDir {
  /** The archive. */
  tar: Buffer;
  /** The SHA-256 of each file packed, by relative path. */
  hashes: Map<string, string>;
  /** Entries left out: links (never followed) and anything not a file or directory. */
  skipped: string[];
}

/**
 * Pack the directory `dir` (members relative to it), leaving out links and special files and
 * the relative paths `exclude` (a path and everything under it). Refused past `maxBytes`.
 */
export function packDir(dir: string, exclude: string[] = [], maxBytes = 256 << 20): PackedDir {
  const parts: Buffer[] = [];
  const hashes = new Map<string, string>();
  const skipped: string[] = [];
  let total = 0;
  const left = (rel: string) =>
    exclude.some((e) => {
      const x = e.replace(/^\/+|\/+$/g, "");
      return rel === x || rel.startsWith(`${x}/`);
    });
  const add = (rel: string, size: number, mode: number, mtime: number, type: string) => {
    let name = type === "5" ? `${rel}/` : rel;
    if (Buffer.byteLength(name) > 100) {
      const pax = paxRecord("path", name);
      parts.push(header("././@PaxHeader", pax.length, 0o644, mtime, "x"), pax, pad(pax.length));
      name = name.slice(0, 99);
    }
    parts.push(header(name, size, mode, mtime, type));
  };
  const walk = (abs: string, rel: string) => {
    const names = readdirSync(abs).sort();
    for (const n of names) {
      const r = rel ? `${rel}/${n}` : n;
      if (left(r)) continue;
      const p = join(abs, n);
      const st = lstatSync(p);
      if (st.isDirectory()) {
        add(r, 0, st.mode, st.mtimeMs / 1000, "5");
        walk(p, r);
      } else if (st.isFile()) {
        const data = readFileSync(p);
        total += data.length;
        if (total > maxBytes) {
          throw new AgentboxError(
            "too_large",
            `seeding ${dir}: over ${maxBytes} bytes of files (leave some out with exclude)`,
            0,
          );
        }
        hashes.set(r, createHash("sha256").update(data).digest("hex"));
        add(r, data.length, st.mode, st.mtimeMs / 1000, "0");
        parts.push(data, pad(data.length));
      } else {
        skipped.push(r);
      }
    }
  };
  walk(dir, "");
  parts.push(Buffer.alloc(2 * BLOCK));
  return { tar: Buffer.concat(parts), hashes, skipped };
}

function field(h: Buffer, at: number, len: number): string {
  const raw = h.subarray(at, at + len);
  const end = raw.indexOf(0);
  return raw.subarray(0, end < 0 ? len : end).toString("utf8");
}

function number(h: Buffer, at: number, len: number, what: string): number {
  const text = field(h, at, len).trim();
  const n = text ? Number.parseInt(text, 8) : 0;
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new AgentboxError(
      "invalid",
      `the archive: a header's ${what} ${JSON.stringify(text)}`,
      0,
    );
  }
  return n;
}

/** What unpacking wrote. */
export interface UnpackedHere {
  /** Relative paths of the files written. */
  files: string[];
  /** The SHA-256 of the bytes written, by relative path. */
  hashes: Map<string, string>;
  /** Members left out, with why. */
  skipped: Array<{ path: string; reason: string }>;
}

/**
 * Unpack `tar` into `dest`: files and directories only, each named by a relative path that
 * stays inside, no link on the way followed (a parent that is not a directory leaves the
 * member out), each file written beside its place and renamed over it. `admit` chooses members;
 * `mayReplace`, asked just before a file is put in place, may still leave it out (a file here
 * that changed meanwhile). A file replaced keeps the permission bits it had here. A member
 * that cannot be written (no space, no permission) is left out and said; the rest go on.
 */
export function unpack(
  tar: Buffer,
  dest: string,
  admit: (path: string) => boolean,
  mayReplace: (path: string) => boolean = () => true,
): UnpackedHere {
  const out: UnpackedHere = { files: [], hashes: new Map(), skipped: [] };
  let at = 0;
  let longName: string | undefined;
  while (at + BLOCK <= tar.length) {
    const h = tar.subarray(at, at + BLOCK);
    if (h.every((b) => b === 0)) break;
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 32 : (h[i] ?? 0);
    if (sum !== number(h, 148, 8, "checksum")) {
      throw new AgentboxError("invalid", `the archive: a bad header checksum at byte ${at}`, 0);
    }
    const size = number(h, 124, 12, "size");
    const type = String.fromCharCode(h[156] ?? 0);
    const bodyAt = at + BLOCK;
    if (bodyAt + size > tar.length) {
      throw new AgentboxError(
        "invalid",
        `the archive: a member runs past its end at byte ${at}`,
        0,
      );
    }
    const body = tar.subarray(bodyAt, bodyAt + size);
    at = bodyAt + size + ((BLOCK - (size % BLOCK)) % BLOCK);
    if (type === "x") {
      const m = /(?:^|\n)\d+ path=([^\n]*)\n/.exec(body.toString("utf8"));
      if (m) longName = m[1];
      continue;
    }
    if (type === "L") {
      longName = body.toString("utf8").replace(/\0+$/, "");
      continue;
    }
    if (type === "g") continue;
    const prefix = field(h, 345, 155);
    const name = longName ?? (prefix ? `${prefix}/${field(h, 0, 100)}` : field(h, 0, 100));
    longName = undefined;
    const segs = segments(name);
    if (!segs) {
      out.skipped.push({ path: name, reason: "unsafe_path" });
      continue;
    }
    const rel = segs.join("/");
    if (!admit(rel)) continue;
    if (type !== "0" && type !== "\0" && type !== "5") {
      out.skipped.push({ path: rel, reason: type === "2" ? "link" : "unsupported" });
      continue;
    }
    try {
      const why = place(dest, segs, type === "5", body, number(h, 100, 8, "mode"), () =>
        mayReplace(rel),
      );
      if (why) out.skipped.push({ path: rel, reason: why });
      else if (type !== "5") {
        out.files.push(rel);
        out.hashes.set(rel, createHash("sha256").update(body).digest("hex"));
      }
    } catch (e) {
      out.skipped.push({ path: rel, reason: `not_written: ${(e as Error).message}` });
    }
  }
  return out;
}

/** What `lstat` says of `p`, or `undefined` where nothing is (or a file is where a directory was). */
export function lstatOrNone(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return undefined;
    throw e;
  }
}

/**
 * Put one member in place under `dest`: its parents real directories (made when missing, never
 * a link), a file written beside its place and renamed over it. Answers why it was left out.
 */
function place(
  dest: string,
  segs: string[],
  isDir: boolean,
  body: Buffer,
  boxMode: number,
  mayReplace: () => boolean,
): string | undefined {
  let dir = dest;
  for (const s of segs.slice(0, isDir ? segs.length : -1)) {
    dir = join(dir, s);
    const st = lstatOrNone(dir);
    if (!st) mkdirSync(dir, { mode: 0o755 });
    else if (!st.isDirectory()) return "not_a_directory_on_the_way";
  }
  if (isDir) return undefined;
  const target = join(dir, segs[segs.length - 1] ?? "");
  const here = lstatOrNone(target);
  if (here?.isDirectory()) return "a_directory_here";
  // A file replaced keeps its bits here; a new one takes the box's, less setuid, setgid,
  // sticky and others' write.
  const mode = here?.isFile() ? here.mode & 0o777 : boxMode & 0o775;
  const tmp = join(dir, `.agentbox-${randomBytes(6).toString("hex")}`);
  const fd = openSync(tmp, "wx", mode);
  try {
    try {
      writeSync(fd, body);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    if (!mayReplace()) {
      unlinkSync(tmp);
      return "changed_here";
    }
    renameSync(tmp, target);
  } catch (e) {
    try {
      unlinkSync(tmp);
    } catch {
      // Renamed into place, or never made.
    }
    throw e;
  }
  return undefined;
}
