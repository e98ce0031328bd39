// The judge of E2B's domain mode as `agentbox serve --e2b --e2b-domain` serves it, in
// JavaScript: E2B's own npm SDK (`e2b`, pinned in package.json), told nothing but E2B_DOMAIN
// and E2B_API_KEY, as a program written for E2B's cloud is. The twin of
// crates/agentbox-cli/tests/e2b_domain_judge.py, with the same steps.
//
// The runner (tests/e2b_api.rs of the CLI) sets E2B_DOMAIN, E2B_API_KEY and
// NODE_EXTRA_CA_CERTS (the authority of the server's `*.DOMAIN` certificate), and runs this
// where DNS answers every name under the domain with the server's address, the server on port
// 443. Each step prints `OK <step>`.

import { Sandbox } from "e2b";

const DOMAIN = process.env.E2B_DOMAIN;
for (const unwanted of ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DEBUG"]) {
  if (process.env[unwanted] !== undefined) throw new Error(`${unwanted} is set: domain mode is judged without it`);
}

function ok(step) {
  console.log(`OK ${step}`);
}

function check(cond, what) {
  if (!cond) throw new Error(`judge: ${what}`);
}

/** The first answer of `url` that is 200, within 10 s (a server in the sandbox starting). */
async function once(url, headers = {}) {
  let last;
  for (let i = 0; i < 100; i++) {
    try {
      last = await fetch(url, { headers });
      if (last.status === 200) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`judge: ${url}: ${last?.status ?? last}`);
}

// The SDK's README, as it is written there.
{
  const sandbox = await Sandbox.create();
  const result = await sandbox.commands.run('echo "Hello from E2B!"');
  check(result.stdout === "Hello from E2B!\n", `the README's example: ${result.stdout}`);
  await sandbox.kill();
}
ok("readme");

const sbx = await Sandbox.create({ timeoutMs: 120_000 });
try {
  check(sbx.sandboxDomain === DOMAIN, `the sandbox's domain: ${sbx.sandboxDomain}`);
  check(sbx.envdApiUrl === `https://49983-${sbx.sandboxId}.${DOMAIN}`, `envd's url: ${sbx.envdApiUrl}`);
  ok("create");

  const r = await sbx.commands.run("echo domain-mode");
  check(r.exitCode === 0 && r.stdout === "domain-mode\n", `run: ${r.stdout}`);
  await sbx.files.write("notes/a.txt", "written by the SDK\n");
  check((await sbx.files.read("notes/a.txt")) === "written by the SDK\n", "read back");
  ok("envd");

  const host = sbx.getHost(8000);
  check(host === `8000-${sbx.sandboxId}.${DOMAIN}`, `getHost: ${host}`);
  await sbx.files.write("site/index.html", "served from the sandbox\n");
  await sbx.commands.run("cd site && exec python3 -m http.server 8000 --bind 127.0.0.1", { background: true });
  const page = await once(`https://${host}/index.html`);
  check((await page.text()) === "served from the sandbox\n", "the port through getHost");
  const closed = await fetch(`https://8001-${sbx.sandboxId}.${DOMAIN}/`);
  const closedText = await closed.text();
  check(closed.status === 502 && closedText.includes("no service running on port 8001"), `a closed port: ${closed.status} ${closedText}`);
  ok("port");

  const priv = await Sandbox.create({ timeoutMs: 120_000, network: { allowPublicTraffic: false } });
  try {
    const token = priv.trafficAccessToken;
    check(typeof token === "string" && token.length >= 16, `the traffic access token: ${token}`);
    check(!sbx.trafficAccessToken, "a public sandbox has no traffic token");
    await priv.commands.run("cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1", { background: true });
    const url = `https://${priv.getHost(8000)}/`;
    await once(url, { "e2b-traffic-access-token": token });
    const bare = await fetch(url);
    const bareText = await bare.text();
    check(bare.status === 403 && bareText.includes("traffic access token"), `no token: ${bare.status} ${bareText}`);
    const wrong = await fetch(url, { headers: { "e2b-traffic-access-token": "0".repeat(token.length) } });
    check(wrong.status === 403, `a wrong token: ${wrong.status}`);
  } finally {
    await priv.kill();
  }
  ok("private-port");

  const url = await sbx.downloadUrl("notes/a.txt");
  check(url.includes("signature=v1_"), `downloadUrl is signed: ${url}`);
  const got = await fetch(url);
  const gotText = await got.text();
  check(got.status === 200 && gotText === "written by the SDK\n", `download: ${got.status} ${gotText}`);
  const up = await sbx.uploadUrl("notes/b.txt", { useSignatureExpiration: 60 });
  const form = new FormData();
  form.append("file", new Blob(["uploaded by URL\n"]), "b.txt");
  const posted = await fetch(up, { method: "POST", body: form });
  check(posted.status === 200, `upload: ${posted.status} ${await posted.text()}`);
  check((await sbx.files.read("notes/b.txt")) === "uploaded by URL\n", "the upload read back");
  const tampered = await fetch(url.replace("a.txt", "b.txt"));
  const tamperedText = await tampered.text();
  check(tampered.status === 401 && tamperedText.includes("invalid signature"), `another path: ${tampered.status} ${tamperedText}`);
  const misused = await fetch(url, { method: "POST", body: form });
  check(misused.status === 401, `a read URL written to: ${misused.status}`);
  const expired = await fetch(await sbx.downloadUrl("notes/a.txt", { useSignatureExpiration: -10 }));
  const expiredText = await expired.text();
  check(expired.status === 401 && expiredText.includes("expired"), `expired: ${expired.status} ${expiredText}`);
  const unsigned = await fetch(url.split("&signature=")[0]);
  check(unsigned.status === 401, `unsigned: ${unsigned.status}`);
  ok("signed-urls");

  const unknown = await fetch(`https://nothing.${DOMAIN}/health`);
  const unknownText = await unknown.text();
  check(unknown.status === 404 && unknownText.includes("no host of this server's"), `unknown host: ${unknown.status} ${unknownText}`);
  ok("hosts");
} finally {
  await sbx.kill();
}
check(!(await sbx.isRunning()), "killed, and still running");
ok("kill");
