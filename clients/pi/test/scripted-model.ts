/**
 * A model for pi's own command line in tests: pi-ai's faux model, registered as the provider
 * `scripted`, answering with the tool calls in `AGENTBOX_PI_SCRIPT` (a JSON list of
 * `{name, args}`), one a turn, then "done".
 */
import { fauxAssistantMessage, fauxToolCall, registerFauxProvider } from "@mariozechner/pi-ai";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function scripted(pi: ExtensionAPI): void {
  const calls = JSON.parse(process.env.AGENTBOX_PI_SCRIPT ?? "[]") as Array<{
    name: string;
    args: Record<string, unknown>;
  }>;
  const faux = registerFauxProvider({
    api: "scripted",
    provider: "scripted",
    models: [{ id: "scripted" }],
  });
  faux.setResponses([
    ...calls.map((c, i) =>
      fauxAssistantMessage([fauxToolCall(c.name, c.args, { id: `call_${i}` })], {
        stopReason: "toolUse",
      }),
    ),
    fauxAssistantMessage("done"),
  ]);
  pi.registerProvider("scripted", {
    baseUrl: "http://127.0.0.1:9",
    apiKey: "scripted",
    api: "scripted",
    models: [
      {
        id: "scripted",
        name: "scripted",
        reasoning: false,
        input: ["text"],
        cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
        contextWindow: 100_000_000,
        maxTokens: 100_000,
      },
    ],
  });
}
