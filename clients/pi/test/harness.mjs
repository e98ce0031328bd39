// A pi session scripted with pi-ai's faux model: each step one tool call, in order, run by
// pi's agent loop, with the extension loaded (`boxed`) or pi's built-in tools on this machine.
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { fauxAssistantMessage, fauxToolCall, registerFauxProvider } from "@mariozechner/pi-ai";
import {
  AuthStorage,
  createAgentSession,
  DefaultResourceLoader,
  ModelRegistry,
  SessionManager,
  SettingsManager,
} from "@mariozechner/pi-coding-agent";

/** This package: what `pi -e` loads. */
export const EXTENSION = join(dirname(fileURLToPath(import.meta.url)), "..");

export const TOOLS = ["read", "bash", "edit", "write", "grep", "find", "ls"];

/**
 * Run `calls` ({name, args}) through a pi session in `cwd`. Answers each call's result as pi
 * recorded it ({name, content, details, isError}) and the session, still open.
 */
export async function runSession({ cwd, agentDir, boxed, calls, sessionId, flags, ui, config }) {
  // A test's box ends with its session (and within a quarter of an hour whatever happens),
  // unless the test says otherwise.
  writeFileSync(
    join(agentDir, "agentbox.json"),
    JSON.stringify({ onExit: "end", lifetime: "15m", ...config }),
  );
  // A window no output fills, and no compaction: each scripted answer is one tool call's.
  const faux = registerFauxProvider({
    models: [{ id: "faux-judge", contextWindow: 100_000_000, maxTokens: 100_000 }],
  });
  let made = 0;
  const script = (more) => [
    ...more.map((c) =>
      fauxAssistantMessage([fauxToolCall(c.name, c.args, { id: `call_${made++}` })], {
        stopReason: "toolUse",
      }),
    ),
    fauxAssistantMessage("done"),
  ];
  faux.setResponses(script(calls));
  const loader = new DefaultResourceLoader({
    cwd,
    agentDir,
    noExtensions: true,
    additionalExtensionPaths: boxed ? [EXTENSION] : [],
    noSkills: true,
    noPromptTemplates: true,
    noThemes: true,
    noContextFiles: true,
  });
  await loader.reload();
  const authStorage = AuthStorage.inMemory();
  authStorage.setRuntimeApiKey(faux.getModel().provider, "faux");
  const sessionManager = SessionManager.inMemory(cwd);
  if (sessionId) sessionManager.newSession({ id: sessionId });
  const { session, extensionsResult } = await createAgentSession({
    cwd,
    agentDir,
    model: faux.getModel(),
    authStorage,
    modelRegistry: ModelRegistry.inMemory(authStorage),
    resourceLoader: loader,
    sessionManager,
    settingsManager: SettingsManager.inMemory({
      compaction: { enabled: false },
      retry: { enabled: false },
    }),
    tools: TOOLS,
  });
  if (extensionsResult.errors.length) {
    throw new Error(`the extension did not load: ${JSON.stringify(extensionsResult.errors)}`);
  }
  for (const [name, value] of Object.entries(flags ?? {})) {
    extensionsResult.runtime.flagValues.set(name, value);
  }
  const errors = [];
  await session.bindExtensions({
    onError: (e) => errors.push(e),
    ...(ui ? { uiContext: ui } : {}),
  });
  // The results as pi recorded them in the session, from the `seen`th on.
  const resultsFrom = (seen) =>
    session.messages
      .filter((m) => m.role === "toolResult")
      .slice(seen)
      .map((m) => ({
        name: m.toolName,
        content: m.content,
        details: m.details,
        isError: m.isError,
      }));
  await session.prompt("go");
  const results = resultsFrom(0);
  /** Another prompt, its model scripted to make `more` calls: their results. */
  const prompt = async (more) => {
    const seen = resultsFrom(0).length;
    faux.setResponses(script(more));
    await session.prompt("go on");
    return resultsFrom(seen);
  };
  session.faux = faux;
  return { session, results, errors, prompt };
}

/**
 * A UI for the extension: what it notifies and shows in its status line kept, each confirm
 * answered by `answers` in turn (false once they run out), every other call a no-op.
 */
export function recordingUI(answers = []) {
  const seen = { notes: [], status: new Map(), confirms: [] };
  const ui = new Proxy(
    {
      notify: (message, type) => seen.notes.push({ message, type }),
      setStatus: (key, text) => seen.status.set(key, text),
      confirm: async (title, message) => {
        seen.confirms.push(`${title}: ${message}`);
        return answers.shift() ?? false;
      },
      theme: new Proxy({}, { get: () => (_c, t) => t }),
    },
    { get: (o, k) => (k in o ? o[k] : () => undefined) },
  );
  return { ui, seen };
}

/** End a session as pi does when it quits: its extensions' session_shutdown, then disposal. */
export async function closeSession(session) {
  await session.extensionRunner.emit({ type: "session_shutdown", reason: "quit" });
  session.dispose();
  session.faux?.unregister();
}

/**
 * Bring back what the box changed by the user's `/agentbox pull`: pi emits each turn's events
 * (and the extension's pull after each turn) on a queue `prompt` does not wait for; the
 * command's pull runs after any under way.
 */
export async function pullNow(session) {
  await session.prompt("/agentbox pull");
}

/**
 * The user's `!command`, as pi's interactive mode runs it: `user_bash` to the extensions, then
 * pi's executeBash with the operations (or the result) they gave.
 */
export async function userBash(session, command) {
  const given = await session.extensionRunner.emitUserBash({
    type: "user_bash",
    command,
    excludeFromContext: false,
    cwd: session.sessionManager.getCwd(),
  });
  if (given?.result) return given.result;
  return session.executeBash(command, undefined, { operations: given?.operations });
}
