/**
 * `@agentbox/pi`: every one of pi's tools in an agentbox box, and the user's `!` commands too.
 *
 * ```sh
 * pi -e ./clients/pi                          # a namespace box, this directory seeded into it
 * pi -e ./clients/pi --agentbox-provider docker
 * ```
 *
 * read, write, edit and bash are pi's own tools over the box's file system and shell (their
 * truncation, messages and details are pi's); grep, find and ls are agentbox's, which give
 * pi's output from inside the box (a box needs no ripgrep nor fd). The box is named after the
 * session, so `/resume` finds it again; what it changes comes back after each turn.
 */
import { resolve } from "node:path";

import {
  createBashToolDefinition,
  createEditToolDefinition,
  createFindToolDefinition,
  createGrepToolDefinition,
  createLsToolDefinition,
  createReadToolDefinition,
  createWriteToolDefinition,
  type ExtensionAPI,
  type ExtensionContext,
  getAgentDir,
  type ToolDefinition,
} from "@mariozechner/pi-coding-agent";

import { type AgentboxConfig, loadConfig } from "./config.js";
import { grepWithContext } from "./grep.js";
import { bashOps, editOps, readOps, writeOps } from "./operations.js";
import { BoxLost, BoxSession, boxName } from "./session.js";

/** How long is left, as a person reads it. */
function left(ms: number | undefined): string {
  if (ms === undefined) return "no deadline said";
  if (ms <= 0) return "past its lifetime";
  const m = Math.floor(ms / 60_000);
  return m >= 60 ? `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m left` : `${m}m left`;
}

type ToolResult<D> = {
  content: Array<
    { type: "text"; text: string } | { type: "image"; data: string; mimeType: string }
  >;
  details: D;
};

export default function agentbox(pi: ExtensionAPI): void {
  pi.registerFlag("agentbox-provider", {
    description: "agentbox: the box's provider (namespace, docker, e2b...)",
    type: "string",
  });
  pi.registerFlag("agentbox-image", { description: "agentbox: the box's image", type: "string" });
  pi.registerFlag("agentbox-lifetime", {
    description: "agentbox: the box's lifetime (90m, 2h)",
    type: "string",
  });
  pi.registerFlag("agentbox-box", {
    description: "agentbox: a named box to use instead of one per session",
    type: "string",
  });

  const cwd = process.cwd();
  let session: BoxSession | undefined;
  let failed: string | undefined;
  let asleep = false;

  const status = (ctx: ExtensionContext) => {
    if (!ctx.hasUI) return;
    const s = session;
    const text = s?.lost
      ? "agentbox: box lost"
      : s?.box
        ? `agentbox ${s.box.id} · ${asleep ? "asleep" : left(s.leftMs())}`
        : "agentbox: no box";
    ctx.ui.setStatus("agentbox", text);
  };

  /**
   * With a UI, a new box offered in place of a lost one (seeded from here): once, however many
   * calls found it lost at once.
   */
  let offered: Promise<void> | undefined;
  const offer = (s: BoxSession, ctx: ExtensionContext | undefined): Promise<void> => {
    if (!s.lost || !ctx?.hasUI) return Promise.resolve();
    offered ??= (async () => {
      try {
        status(ctx);
        if (await ctx.ui.confirm("agentbox", `${s.lost}. Make a new box, seeded from here?`)) {
          await s.renew();
          status(ctx);
        }
      } finally {
        offered = undefined;
      }
    })();
    return offered;
  };

  /** The session with a box, or the one line why not. A lost box is offered anew, never the host. */
  const ready = async (ctx: ExtensionContext | undefined): Promise<BoxSession> => {
    const s = session;
    if (failed) throw new BoxLost(failed);
    if (!s) throw new BoxLost("agentbox: no box: the session has not started");
    await offer(s, ctx);
    s.ready();
    if (asleep) {
      await s.guard(() => s.ready().wake());
      asleep = false;
    }
    return s;
  };

  /** A call that finds the box lost says so in its one line, after offering a new box. */
  const offering = async <T>(
    ctx: ExtensionContext | undefined,
    f: () => Promise<T>,
  ): Promise<T> => {
    const lostBefore = session?.lost;
    try {
      return await f();
    } catch (e) {
      // Found lost by this call (a box already lost was offered before it began).
      if (e instanceof BoxLost && session && !lostBefore) await offer(session, ctx);
      throw e;
    }
  };

  /** One of agentbox's own tools, with pi's name, schema and rendering. */
  const boxTool = async <D>(
    name: string,
    params: Record<string, unknown>,
    ctx: ExtensionContext | undefined,
  ): Promise<ToolResult<D>> => {
    const s = await ready(ctx);
    const context = typeof params.context === "number" ? params.context : 0;
    if (name === "grep" && context > 0) {
      const path = resolve(s.cwd, typeof params.path === "string" ? params.path : ".");
      return (await grepWithContext(s, { ...params, path }, context)) as ToolResult<D>;
    }
    const args = {
      ...params,
      path: resolve(s.cwd, typeof params.path === "string" ? params.path : "."),
    };
    const r = await s.guard(() => s.ready().tool(name, args));
    if (r.isError) {
      throw new Error(r.content.map((c) => (c.type === "text" ? c.text : "")).join(""));
    }
    // pi's own give only the notices that apply, and no details when none does.
    const said = Object.entries((r.details ?? {}) as Record<string, unknown>).filter(
      ([, v]) => v !== null && v !== undefined && v !== false,
    );
    const details = said.length > 0 ? Object.fromEntries(said) : undefined;
    return { content: r.content, details: details as D };
  };

  /**
   * One of pi's own tools, registered with pi's name, schema and rendering; each call made by
   * pi's own definition given the box's operations.
   */
  const overBox = <O, T extends { execute: ToolDefinition["execute"] }>(
    create: (cwd: string, options?: { operations?: O }) => T,
    operations: (s: BoxSession) => O,
  ) => {
    pi.registerTool({
      ...(create(cwd) as unknown as ToolDefinition),
      execute: (id, params, signal, onUpdate, ctx) =>
        offering(ctx, async () => {
          const s = await ready(ctx);
          const def = create(s.cwd, { operations: operations(s) });
          return def.execute(id, params, signal, onUpdate, ctx);
        }),
    });
  };
  overBox(createReadToolDefinition, readOps);
  overBox(createWriteToolDefinition, writeOps);
  overBox(createEditToolDefinition, editOps);
  overBox(createBashToolDefinition, bashOps);
  // agentbox's grep, find and ls, with pi's names, schemas and rendering.
  pi.registerTool({
    ...createGrepToolDefinition(cwd),
    execute: (_id, params, _signal, _onUpdate, ctx) =>
      offering(ctx, () => boxTool("grep", params, ctx)),
  });
  pi.registerTool({
    ...createFindToolDefinition(cwd),
    execute: (_id, params, _signal, _onUpdate, ctx) =>
      offering(ctx, () => boxTool("find", params, ctx)),
  });
  pi.registerTool({
    ...createLsToolDefinition(cwd),
    execute: (_id, params, _signal, _onUpdate, ctx) =>
      offering(ctx, () => boxTool("ls", params, ctx)),
  });

  // The user's `!` commands run in the box too; what they change comes back when they end.
  pi.on("user_bash", (_event, ctx) => {
    const s = session;
    if (!s?.box || s.lost) {
      const output = s?.lost ?? failed ?? "agentbox: no box";
      return { result: { output, exitCode: 1, cancelled: false, truncated: false } };
    }
    const ops = bashOps(s);
    return {
      operations: {
        exec: async (command, dir, options) => {
          await ready(ctx);
          try {
            return await ops.exec(command, dir, options);
          } finally {
            await s.pull().catch(() => undefined);
          }
        },
      },
    };
  });

  pi.on("session_start", async (_event, ctx) => {
    const flags: AgentboxConfig = {
      provider: pi.getFlag("agentbox-provider") as string | undefined,
      image: pi.getFlag("agentbox-image") as string | undefined,
      lifetime: pi.getFlag("agentbox-lifetime") as string | undefined,
      box: pi.getFlag("agentbox-box") as string | undefined,
    };
    failed = undefined;
    try {
      const config = loadConfig(ctx.cwd, getAgentDir(), flags);
      const name = boxName(ctx.sessionManager.getSessionId());
      session = new BoxSession(config, ctx.cwd, name, resolve(getAgentDir(), "agentbox"));
      const b = await session.open();
      if (ctx.hasUI) ctx.ui.notify(`agentbox: tools run in ${b.id}`, "info");
    } catch (e) {
      failed = `agentbox: no box, so no tool runs (${(e as Error).message})`;
      if (ctx.hasUI) ctx.ui.notify(failed, "error");
    }
    status(ctx);
  });

  pi.on("turn_end", async (_event, ctx) => {
    const s = session;
    if (!s?.box || s.lost) return status(ctx);
    try {
      const kept = await s.pull();
      if (kept.length > 0 && ctx.hasUI) {
        ctx.ui.notify(
          `agentbox: left as edited here, not the box's: ${kept.join(", ")}`,
          "warning",
        );
      }
    } catch (e) {
      if (ctx.hasUI) ctx.ui.notify(`agentbox: pulling back: ${(e as Error).message}`, "error");
    }
    status(ctx);
  });

  pi.on("session_shutdown", async () => {
    const s = session;
    session = undefined;
    await s?.close();
  });

  pi.on("before_agent_start", async (event) => {
    const s = session;
    if (!s?.box) return;
    return {
      systemPrompt: `${event.systemPrompt}\n\nYour tools run in a sandbox (agentbox box ${s.box.id}), in a copy of ${s.cwd} at the same path; what you change there comes back to the user's machine.`,
    };
  });

  pi.registerCommand("agentbox", {
    description: "The session's box: show it, or extend [minutes], sleep, end, new, pull",
    getArgumentCompletions: (prefix) =>
      ["extend", "sleep", "end", "new", "pull"]
        .filter((c) => c.startsWith(prefix))
        .map((c) => ({ value: c, label: c })),
    handler: async (args, ctx) => {
      const [verb = "", n] = args.trim().split(/\s+/);
      const s = session;
      const say = (text: string, kind: "info" | "warning" | "error" = "info") =>
        ctx.ui.notify(text, kind);
      if (!s) return say(failed ?? "agentbox: no box", "error");
      try {
        if (verb === "new") {
          const b = await s.renew();
          asleep = false;
          say(`agentbox: a new box, ${b.id}, seeded from ${s.cwd}`);
        } else if (s.lost) {
          say(`${s.lost}`, "error");
        } else if (verb === "" || verb === "status") {
          const b = s.ready();
          const info = await s.guard(() => b.refresh());
          const facts = Object.entries(info.facts)
            .map(([k, v]) => `  ${k}: ${typeof v === "object" ? JSON.stringify(v) : String(v)}`)
            .join("\n");
          say(`agentbox ${b.id} (${info.status ?? "?"}, ${left(s.leftMs())})\n${facts}`);
        } else if (verb === "extend") {
          const minutes = n === undefined ? 60 : Number(n);
          if (!Number.isFinite(minutes) || minutes <= 0)
            return say(`agentbox: extend ${n}: minutes, a positive number`, "error");
          await s.guard(() => s.ready().extend({ byMs: Math.round(minutes * 60_000) }));
          say(`agentbox: ${left(s.leftMs())}`);
        } else if (verb === "sleep") {
          await s.pull();
          await s.guard(() => s.ready().sleep());
          asleep = true;
          say("agentbox: asleep; the next tool call wakes it");
        } else if (verb === "end") {
          if (
            ctx.hasUI &&
            !(await ctx.ui.confirm("agentbox", `End ${s.ready().id} and every program in it?`))
          )
            return;
          await s.pull();
          await s.guard(() => s.ready().delete());
          say("agentbox: ended; /agentbox new makes a new box");
        } else if (verb === "pull") {
          const kept = await s.pull();
          say(
            kept.length
              ? `agentbox: pulled; left as edited here: ${kept.join(", ")}`
              : "agentbox: pulled",
          );
        } else {
          say(`agentbox: ${verb}: not a verb (extend [minutes], sleep, end, new, pull)`, "error");
        }
      } catch (e) {
        say((e as Error).message, "error");
      }
      status(ctx);
    },
  });
}
