"""The judge of E2B's domain mode as `agentbox serve --e2b --e2b-domain` serves it: E2B's own
Python SDK (`e2b` 2.x), told nothing but E2B_DOMAIN and E2B_API_KEY, as a program written for
E2B's cloud is, reaches the control plane at https://api.DOMAIN, envd at
https://49983-ID.DOMAIN, a sandbox's port at the address `get_host` gives, and its files at the
signed URLs `download_url` and `upload_url` give; the SDK's README example runs as written.

The runner (tests/e2b_api.rs) sets E2B_DOMAIN, E2B_API_KEY and SSL_CERT_FILE (the authority of
the server's `*.DOMAIN` certificate), and runs this where DNS answers every name under the
domain with the server's address (a resolv.conf of its own naming a wildcard DNS server), the
server on port 443. Each step prints `OK <step>`.
"""

import os
import time

import httpx
from e2b import E2B, Sandbox

DOMAIN = os.environ["E2B_DOMAIN"]
for unwanted in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DEBUG"):
    assert unwanted not in os.environ, f"{unwanted} is set: domain mode is judged without it"


def ok(step):
    print(f"OK {step}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# The SDK's README, as it is written there: the environment's configuration, then a client's.
with Sandbox.create() as sandbox:
    result = sandbox.commands.run('echo "Hello from E2B!"')
    check(result.stdout == "Hello from E2B!\n", f"the README's example: {result}")
client = E2B(api_key=os.environ["E2B_API_KEY"], domain=DOMAIN)
with client.Sandbox.create() as sandbox:
    check(sandbox.commands.run("echo $E2B_SANDBOX").stdout == "true\n", "a client's sandbox")
ok("readme")

sbx = Sandbox.create(timeout=120)
try:
    # The control plane at api.DOMAIN made it, and named this server's domain as its own.
    check(sbx.sandbox_domain == DOMAIN, f"the sandbox's domain: {sbx.sandbox_domain!r}")
    check(
        sbx.envd_api_url == f"https://49983-{sbx.sandbox_id}.{DOMAIN}",
        f"envd's url: {sbx.envd_api_url}",
    )
    ok("create")

    # envd by host name: a command and a file.
    r = sbx.commands.run("echo domain-mode")
    check(r.exit_code == 0 and r.stdout == "domain-mode\n", f"run: {r}")
    sbx.files.write("notes/a.txt", "written by the SDK\n")
    check(sbx.files.read("notes/a.txt") == "written by the SDK\n", "read back")
    ok("envd")

    # A sandbox's own port, at the address get_host gives.
    host = sbx.get_host(8000)
    check(host == f"8000-{sbx.sandbox_id}.{DOMAIN}", f"get_host: {host}")
    sbx.files.write("site/index.html", "served from the sandbox\n")
    sbx.commands.run(
        "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1",
        background=True,
    )
    got = None
    for _ in range(100):
        try:
            res = httpx.get(f"https://{host}/index.html", timeout=10)
            if res.status_code == 200:
                got = res.text
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    check(got == "served from the sandbox\n", f"the port through get_host: {got!r}")
    closed = httpx.get(f"https://8001-{sbx.sandbox_id}.{DOMAIN}/", timeout=10)
    check(
        closed.status_code == 502 and "no service running on port 8001" in closed.text,
        f"a closed port: {closed.status_code} {closed.text}",
    )
    ok("port")

    # A sandbox whose ports are not public: its traffic access token is asked for.
    private = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        token = private.traffic_access_token
        check(isinstance(token, str) and len(token) >= 16, f"the traffic access token: {token!r}")
        check(sbx.traffic_access_token is None, "a public sandbox has no traffic token")
        private.commands.run(
            "cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1",
            background=True,
        )
        url = f"https://{private.get_host(8000)}/"
        status = None
        for _ in range(100):
            try:
                status = httpx.get(url, headers={"e2b-traffic-access-token": token}, timeout=10).status_code
                if status == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        check(status == 200, f"the private port with its token: {status}")
        res = httpx.get(url, timeout=10)
        check(res.status_code == 403 and "traffic access token" in res.text, f"no token: {res.status_code} {res.text}")
        res = httpx.get(url, headers={"e2b-traffic-access-token": "0" * len(token)}, timeout=10)
        check(res.status_code == 403, f"a wrong token: {res.status_code} {res.text}")
    finally:
        private.kill()
    ok("private-port")

    # Files at signed URLs, fetched with no token or key: as a browser would.
    url = sbx.download_url("notes/a.txt")
    check("signature=v1_" in url, f"download_url is signed: {url}")
    res = httpx.get(url, timeout=10)
    check(res.status_code == 200 and res.text == "written by the SDK\n", f"download: {res.status_code} {res.text}")
    up = sbx.upload_url("notes/b.txt", use_signature_expiration=60)
    res = httpx.post(up, files={"file": ("b.txt", b"uploaded by URL\n")}, timeout=10)
    check(res.status_code == 200, f"upload: {res.status_code} {res.text}")
    check(sbx.files.read("notes/b.txt") == "uploaded by URL\n", "the upload read back")
    # Not a signature for this path, this operation, or past its expiration: 401.
    tampered = url.replace("a.txt", "b.txt", 1)
    res = httpx.get(tampered, timeout=10)
    check(res.status_code == 401 and "invalid signature" in res.text, f"another path: {res.status_code} {res.text}")
    res = httpx.post(url, files={"file": ("a.txt", b"x")}, timeout=10)
    check(res.status_code == 401, f"a read URL written to: {res.status_code} {res.text}")
    expired = sbx.download_url("notes/a.txt", use_signature_expiration=-10)
    res = httpx.get(expired, timeout=10)
    check(res.status_code == 401 and "expired" in res.text, f"expired: {res.status_code} {res.text}")
    res = httpx.get(url.split("&signature=")[0], timeout=10)
    check(res.status_code == 401, f"unsigned: {res.status_code} {res.text}")
    ok("signed-urls")

    # A name under the domain that is none of E2B's hosts.
    res = httpx.get(f"https://nothing.{DOMAIN}/health", timeout=10)
    check(res.status_code == 404 and "no host of this server's" in res.text, f"unknown host: {res.status_code} {res.text}")
    ok("hosts")
finally:
    sbx.kill()
check(not sbx.is_running(), "killed, and still running")
ok("kill")
