// The config files and flags, loaded as pi loads the extension (through jiti): merged user,
// project, flags; each bad field refused naming the file and the field; the spec they ask for.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";

import { createJiti } from "jiti";

const { loadConfig, specOf, lifetimeMs } = await createJiti(import.meta.url).import(
  "../src/config.ts",
);

it("merges the user's file, the project's and the flags, and asks for the spec they say", () => {
  const cwd = mkdtempSync(join(tmpdir(), "pi-config-"));
  const agentDir = mkdtempSync(join(tmpdir(), "pi-config-agent-"));
  try {
    writeFileSync(
      join(agentDir, "agentbox.json"),
      JSON.stringify({ provider: "docker", lifetime: "30m", network: "none" }),
    );
    mkdirSync(join(cwd, ".pi"));
    writeFileSync(
      join(cwd, ".pi/agentbox.json"),
      JSON.stringify({
        image: "debian:trixie",
        network: ["api.github.com"],
        ports: [3000, { port: 22, kind: "tcp" }],
      }),
    );
    const c = loadConfig(cwd, agentDir, { lifetime: "1h30m", provider: undefined });
    assert.deepEqual(specOf(c), {
      max_lifetime_ms: 5_400_000,
      image: "debian:trixie",
      network: { allow: ["api.github.com"] },
      ports: [{ port: 3000 }, { port: 22, kind: "tcp" }],
    });
    assert.equal(c.provider, "docker");
    assert.equal(specOf({}).max_lifetime_ms, 7_200_000, "two hours unless said");

    writeFileSync(join(cwd, ".pi/agentbox.json"), JSON.stringify({ lifetme: "2h" }));
    assert.throws(() => loadConfig(cwd, agentDir), /\.pi\/agentbox\.json: lifetme: not a field/);
    writeFileSync(join(cwd, ".pi/agentbox.json"), JSON.stringify({ ports: ["http"] }));
    assert.throws(() => loadConfig(cwd, agentDir), /agentbox\.json: ports: a list of port numbers/);
    writeFileSync(join(cwd, ".pi/agentbox.json"), "{ not json");
    assert.throws(() => loadConfig(cwd, agentDir), /agentbox\.json: not JSON/);
    writeFileSync(join(cwd, ".pi/agentbox.json"), "{}");
    assert.throws(
      () => loadConfig(cwd, agentDir, { lifetime: "soon" }),
      /flags: lifetime "soon": write it as 90m/,
    );
    assert.equal(lifetimeMs(45, "x"), 45_000);
    assert.throws(() => lifetimeMs("0m", "x"), /not positive/);
  } finally {
    rmSync(cwd, { recursive: true, force: true });
    rmSync(agentDir, { recursive: true, force: true });
  }
});
