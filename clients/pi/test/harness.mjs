// A pi session scripted with pi-ai's faux model: each step one tool call, in order, run by
// pi's agent loop, with the extension loaded (`boxed`) or pi's built-in tools on this machine.
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
export async function runSession({ cwd, agentDir, boxed, calls, sessionId, flags }) {
  // A window no output fills, and no compaction: each scripted answer is one tool call's.
  const faux = registerFauxProvider({
    models: [{ id: "faux-judge", contextWindow: 100_000_000, maxTokens: 100_000 }],
  });
  const steps = calls.map((c, i) =>
    fauxAssistantMessage([fauxToolCall(c.name, c.args, { id: `call_${i}` })], {
      stopReason: "toolUse",
    }),
  );
  faux.setResponses([...steps, fauxAssistantMessage("done")]);
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
  await session.bindExtensions({ onError: (e) => errors.push(e) });
  await session.prompt("go");
  faux.unregister();
  // The results as pi recorded them in the session.
  const results = session.messages
    .filter((m) => m.role === "toolResult")
    .map((m) => ({ name: m.toolName, content: m.content, details: m.details, isError: m.isError }));
  return { session, results, errors };
}

/** End a session as pi does when it quits: its extensions' session_shutdown, then disposal. */
export async function closeSession(session) {
  await session.extensionRunner.emit({ type: "session_shutdown", reason: "quit" });
  session.dispose();
}

/**
 * Bring back what the box changed by the user's `/agentbox pull`: pi emits each turn's events
 * (and the extension's pull after each turn) on a queue `prompt` does not wait for; the
 * command's pull runs after any under way.
 */
export async function pullNow(session) {
  await session.prompt("/agentbox pull");
}
