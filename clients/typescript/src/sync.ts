/**
 * agentbox's sync over the API: a directory of this machine seeded into a box, and what the box
 * changed brought back, incrementally and without losing an edit made here.
 *
 * A pull compares the box's listing (kind, size, mode and mtime of each path, as the box
 * prints them; never its clock against this one) with the mark of the last seed or pull, asks
 * for only what changed, and unpacks it without trusting it. A file changed here since the mark
 * is never replaced nor removed: it is named in `hostChanged`, again at each pull.
 */
import { createHash } from "node:crypto";
import { readFileSync, rmdirSync, unlinkSync } from "node:fs";
import { join } from "node:path";

import type { Box } from "./client.js";
import type { ListedEntry } from "./models.js";
import { lstatOrNone, packDir, segments, unpack } from "./tar.js";

/** The most names, and listed bytes, one pick asks for: a large change comes in parts. */
const PICK_NAMES = 2000;
const PICK_BYTES = 64 << 20;

/** One path as the box last listed it, with the SHA-256 of what this machine holds for it. */
export interface MarkEntry extends ListedEntry {
  sha256?: string;
  /** The box no longer lists it and this machine still has it (kept until it is removed). */
  gone?: boolean;
}

/** The box's listing at the last seed or pull, by relative path. */
export type Mark = Record<string, MarkEntry>;

/** What a seed did. */
export interface Seeded {
  /** Files and directories sent. */
  sent: number;
  /** Paths here left out: links (never followed) and special files. */
  skipped: string[];
  /** The mark to pull against. */
  mark: Mark;
}

/** What a pull did. */
export interface Pulled {
  /** Files written here. */
  written: string[];
  /** Paths removed here because the box removed them. */
  deleted: string[];
  /** Paths left as they are here because they changed here since the mark. */
  hostChanged: string[];
  /** Members the unpacking left out, with why. */
  skipped: Array<{ path: string; reason: string }>;
  /** The next mark. */
  mark: Mark;
}

function sha256(path: string): string | undefined {
  try {
    const st = lstatOrNone(path);
    if (!st?.isFile()) return undefined;
    return createHash("sha256").update(readFileSync(path)).digest("hex");
  } catch {
    return undefined;
  }
}

/**
 * Send the directory `from` (of this machine) into the box at `to`, links never followed.
 *
 * ```ts
 * const { mark } = await seed(box, process.cwd(), "/work");
 * ```
 */
export async function seed(
  box: Box,
  from: string,
  to: string,
  exclude: string[] = [],
): Promise<Seeded> {
  const packed = packDir(from, exclude);
  const unpacked = await box.uploadTar(to, packed.tar);
  const listed = await box.listing(to);
  const mark: Mark = {};
  for (const [p, e] of Object.entries(listed.entries)) {
    if (left(p, exclude)) continue;
    mark[p] = e.kind === "f" ? { ...e, sha256: packed.hashes.get(p) } : { ...e };
  }
  return { sent: unpacked.sent, skipped: packed.skipped, mark };
}

function left(rel: string, exclude: string[]): boolean {
  return exclude.some((e) => {
    const x = e.replace(/^\/+|\/+$/g, "");
    return rel === x || rel.startsWith(`${x}/`);
  });
}

function same(a: ListedEntry, b: ListedEntry): boolean {
  return a.kind === b.kind && a.size === b.size && a.mode === b.mode && a.mtime === b.mtime;
}

/**
 * Bring back into `to` (of this machine) what the box's `from` changed since `since`, removing
 * here what the box removed. Nothing changed here since the mark is replaced or removed.
 *
 * ```ts
 * const pulled = await pull(box, "/work", process.cwd(), mark);
 * mark = pulled.mark;
 * ```
 */
export async function pull(
  box: Box,
  from: string,
  to: string,
  since: Mark = {},
  exclude: string[] = [],
): Promise<Pulled> {
  const listed = (await box.listing(from)).entries;
  const here = (p: string) => join(to, ...(segments(p) ?? []));
  const hostChanged: string[] = [];
  const wanted: string[] = [];
  // What this machine held for each wanted file when it was compared: it must still hold it
  // when the box's copy is put in place, or the box's is left out.
  const held = new Map<string, string | undefined>();
  for (const [p, e] of Object.entries(listed)) {
    if (left(p, exclude) || (e.kind !== "f" && e.kind !== "d") || !segments(p)) continue;
    const old = since[p];
    if (old && !old.gone && same(old, e)) continue;
    if (e.kind === "f") {
      const now = lstatOrNone(here(p)) ? sha256(here(p)) : undefined;
      if (lstatOrNone(here(p)) && (!old?.sha256 || now !== old.sha256)) {
        hostChanged.push(p);
        continue;
      }
      held.set(p, now);
    }
    wanted.push(p);
  }
  const wantedSet = new Set(wanted);
  const written: string[] = [];
  const hashes = new Map<string, string>();
  const skipped: Pulled["skipped"] = [];
  const mayReplace = (p: string) => {
    const now = lstatOrNone(here(p)) ? sha256(here(p)) : undefined;
    if (now === held.get(p)) return true;
    hostChanged.push(p);
    return false;
  };
  // In parts, each put in place as it comes.
  for (let i = 0; i < wanted.length; ) {
    const part: string[] = [];
    let bytes = 0;
    while (
      i < wanted.length &&
      part.length < PICK_NAMES &&
      (part.length === 0 || bytes < PICK_BYTES)
    ) {
      const p = wanted[i++] as string;
      part.push(p);
      bytes += listed[p]?.size ?? 0;
    }
    const u = unpack(await box.pick(from, part), to, (p) => wantedSet.has(p), mayReplace);
    written.push(...u.files);
    for (const [p, h] of u.hashes) hashes.set(p, h);
    skipped.push(...u.skipped.filter((x) => x.reason !== "changed_here"));
  }
  const writtenSet = new Set(written);
  const mark: Mark = {};
  for (const [p, e] of Object.entries(listed)) {
    if (left(p, exclude)) continue;
    if (e.kind !== "f") {
      mark[p] = { ...e };
    } else if (writtenSet.has(p)) {
      mark[p] = { ...e, sha256: hashes.get(p) };
    } else if (wantedSet.has(p) || hostChanged.includes(p)) {
      // Not written (or left as this machine has it): the old entry stays, so the next pull
      // sees the box's change again.
      const old = since[p];
      if (old) mark[p] = old;
    } else {
      mark[p] = { ...e, sha256: since[p]?.sha256 };
    }
  }
  // What the box no longer lists: removed here while this machine's copy is the one the mark
  // records, deepest first; a directory only when empty.
  const gone = Object.keys(since)
    .filter((p) => !(p in listed) && !left(p, exclude))
    .sort((a, b) => b.split("/").length - a.split("/").length);
  const deleted: string[] = [];
  for (const p of gone) {
    const old = since[p] as MarkEntry;
    if (!segments(p)) continue;
    const path = here(p);
    try {
      const st = lstatOrNone(path);
      if (!st) continue;
      if (old.kind === "f" && st.isFile()) {
        if (sha256(path) !== old.sha256) {
          hostChanged.push(p);
          mark[p] = { ...old, gone: true };
          continue;
        }
        unlinkSync(path);
      } else if (old.kind === "d" && st.isDirectory()) {
        rmdirSync(path);
      } else {
        mark[p] = { ...old, gone: true };
        continue;
      }
      deleted.push(p);
    } catch {
      // A directory with entries the box never had stays, remembered.
      mark[p] = { ...old, gone: true };
    }
  }
  return { written, deleted, hostChanged, skipped, mark };
}
