"""The judge of E2B's base template as `agentbox serve --e2b` serves it from the image
`scripts/box-image --e2b-base` builds: E2B's own Python SDK makes a sandbox of the default
template (`base`) and finds what E2B's base image gives a program.

The runner (tests/e2b_api.rs) sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and
E2B_HTTP_VERSION, as for the main judge, and JUDGE_BOXES: `docker` (the image, its server's
boxes keeping their capabilities, as sudo needs) or `namespace` (the same tree unpacked as a
rootfs by `scripts/box-rootfs --e2b-base`: its tools and its /etc, but a namespace box's one
user is root of its own user namespace, with no capability to change user, starting in
/workspace, its home /root, and no /home of the image's). Each
step prints `OK <step>`.
"""

import os

from e2b import Sandbox

BOXES = os.environ["JUDGE_BOXES"]


def ok(step):
    print(f"OK {step}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


check(BOXES in ("docker", "namespace"), f"JUDGE_BOXES {BOXES!r}: docker or namespace")

with Sandbox.create() as sbx:
    check(sbx.get_info().template_id == "base", "the default template")
    said = sbx.commands.run('printf "%s\\n" "$(whoami)" "$(pwd)" "$HOME"').stdout
    if BOXES == "namespace":
        check(said == "root\n/workspace\n/root\n", f"a namespace box's user: {said!r}")
        # The image's user is known (its /etc), though the box runs as its own root.
        known = sbx.commands.run("id -u user").stdout
        check(known == "1000\n", f"the image's user, in the rootfs: {known!r}")
        ok("rootfs-user")
    else:
        check(said == "user\n/home/user\n/home/user\n", f"the user, where it starts, its home: {said!r}")
        ok("user")

    for tool, want in [
        ("python3 --version", "Python 3."),
        ("node --version", "v"),
        ("git --version", "git version"),
        ("curl --version", "curl "),
        ("command -v sudo", "/usr/bin/sudo"),
    ]:
        out = sbx.commands.run(tool).stdout
        check(out.startswith(want), f"{tool}: {out!r}")
    ok("tools")

    if BOXES == "docker":
        # Relative paths are the user's home, and what is written there is the user's.
        sbx.files.write("notes.txt", "mine\n")
        owner = sbx.commands.run("stat -c %U /home/user/notes.txt").stdout
        check(owner == "user\n", f"the file's owner: {owner!r}")
        names = {e.name for e in sbx.files.list(".")}
        check({".bashrc", ".profile", "notes.txt"} <= names, f"the home's entries: {names}")
        ok("home")

        r = sbx.commands.run("sudo -n whoami", timeout=30)
        check(r.stdout == "root\n", f"sudo without a password: {r.stdout!r} {r.stderr!r}")
        ok("sudo")
