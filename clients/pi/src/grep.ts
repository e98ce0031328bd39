/**
 * pi's grep with `context`: agentbox's grep finds the matches in the box (a box needs no
 * ripgrep), and each match's block is written here as pi writes it (overlapping blocks each
 * whole, context lines `path-N- text`, from the box's copy of the file).
 */
import { resolve } from "node:path";

import {
  DEFAULT_MAX_BYTES,
  formatSize,
  truncateHead,
  truncateLine,
} from "@mariozechner/pi-coding-agent";

import type { BoxSession } from "./session.js";

const MATCH = /^(.*?):(\d+): (.*)$/;

/** The matches of agentbox's grep (`path:N: text` lines, then its notices), in order. */
function matchesOf(text: string): { lines: Array<[string, number]>; limited: boolean } {
  const [body = "", notice = ""] = text.split(/\n\n(?=\[[^\n]*\]$)/);
  const lines: Array<[string, number]> = [];
  for (const l of body.split("\n")) {
    const m = MATCH.exec(l);
    if (m) lines.push([m[1] ?? "", Number(m[2])]);
  }
  return { lines, limited: notice.includes("matches limit reached") };
}

/** pi's grep result for `args` with `context` > 0, on the box. */
export async function grepWithContext(
  s: BoxSession,
  args: Record<string, unknown>,
  context: number,
): Promise<{ content: Array<{ type: "text"; text: string }>; details: unknown }> {
  const box = s.ready();
  const searchPath = String(args.path);
  const found = await s.guard(() => box.tool("grep", { ...args, context: 0 }));
  const text = found.content.map((c) => (c.type === "text" ? c.text : "")).join("");
  if (found.isError) throw new Error(text);
  if (text === "No matches found") return { content: [{ type: "text", text }], details: undefined };
  const { lines: matches, limited } = matchesOf(text);
  const info = await s.guard(() => box.stat(searchPath));
  const isDirectory = info.kind === "directory";
  const files = new Map<string, string[]>();
  let linesTruncated = false;
  const out: string[] = [];
  for (const [shown, n] of matches) {
    const file = isDirectory ? resolve(searchPath, shown) : searchPath;
    let lines = files.get(file);
    if (!lines) {
      try {
        const content = (await s.guard(() => box.readFile(file))).toString("utf8");
        lines = content.replace(/\r\n/g, "\n").replace(/\r/g, "\n").split("\n");
      } catch {
        lines = [];
      }
      files.set(file, lines);
    }
    if (!lines.length) {
      out.push(`${shown}:${n}: (unable to read file)`);
      continue;
    }
    const start = Math.max(1, n - context);
    const end = Math.min(lines.length, n + context);
    for (let i = start; i <= end; i++) {
      const t = truncateLine((lines[i - 1] ?? "").replace(/\r/g, ""));
      if (t.wasTruncated) linesTruncated = true;
      out.push(i === n ? `${shown}:${i}: ${t.text}` : `${shown}-${i}- ${t.text}`);
    }
  }
  const truncation = truncateHead(out.join("\n"), { maxLines: Number.MAX_SAFE_INTEGER });
  let output = truncation.content;
  const details: Record<string, unknown> = {};
  const notices: string[] = [];
  const limit = Math.max(1, typeof args.limit === "number" ? args.limit : 100);
  if (limited) {
    notices.push(
      `${limit} matches limit reached. Use limit=${limit * 2} for more, or refine pattern`,
    );
    details.matchLimitReached = limit;
  }
  if (truncation.truncated) {
    notices.push(`${formatSize(DEFAULT_MAX_BYTES)} limit reached`);
    details.truncation = truncation;
  }
  if (linesTruncated) {
    notices.push("Some lines truncated to 500 chars. Use read tool to see full lines");
    details.linesTruncated = true;
  }
  if (notices.length > 0) output += `\n\n[${notices.join(". ")}]`;
  return {
    content: [{ type: "text", text: output }],
    details: Object.keys(details).length > 0 ? details : undefined,
  };
}
