"""A build reads files as its tenant would, never as the server: a kernel source may include
any path, and the compiler's log quotes what it read. A tenant that could not read the
server's files itself (another user, a remote host) builds in the build sandbox: the system's
and the driver's files only. The server's own user builds as natively."""

import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest
from conftest import WH, Server

NOBODY = 65534
SECRET = "#define VALUE 42 /* TOPSECRET-b1d6 */\n"


@pytest.fixture
def place():
    """A directory every local user can reach (pytest's own tmp_path is under a 0700 one),
    with the probe, a header only root may read, and one everyone may."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="wh-sandbox-"))
    d.chmod(0o755)
    probe = d / "include_probe"
    subprocess.run(["gcc", "-O1", "-Wall", "-o", str(probe), str(pathlib.Path(__file__).parent / "c" / "include_probe.c"),
                    "-lOpenCL"], check=True)
    (d / "secret.h").write_text(SECRET)
    (d / "secret.h").chmod(0o600)
    (d / "public.h").write_text("#define VALUE 5\n")
    (d / "public.h").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(argv):
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + [str(a) for a in argv]


def probe(server, place, header=None, user=None, argv=None, **env):
    argv = [place / "include_probe"] + (argv or ([place / header] if header else []))
    cmd = server.cmd(argv)
    r = subprocess.run(as_nobody(cmd) if user == "nobody" else cmd, env=server.env(HOME=str(place), **env),
                       cwd=place, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def native(place, header=None, user=None, argv=None):
    argv = [place / "include_probe"] + (argv or ([place / header] if header else []))
    # PoCL needs a cache directory its user may write.
    cache = place / f"pocl-{user}"
    cache.mkdir(exist_ok=True)
    cache.chmod(0o777)
    r = subprocess.run(as_nobody(argv) if user == "nobody" else [str(a) for a in argv], cwd=place,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(place), "POCL_CACHE_DIR": str(cache)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_another_users_build_cannot_read_the_servers_files(place):
    s = Server(place).start()
    try:
        # Natively that user cannot read the header; through Wormhole (a server running as
        # root) neither, and the log quotes nothing of it.
        assert native(place, "secret.h", user="nobody").startswith("build -11")
        out = probe(s, place, "secret.h", user="nobody")
        assert out.startswith("build -11"), out
        assert "TOPSECRET" not in out and "Permission denied" in out, out
        # Builds that read only what the system and the driver offer work as ever.
        assert probe(s, place, user="nobody") == "value 7\n"
    finally:
        s.stop()


def test_the_servers_own_user_builds_as_natively(place):
    s = Server(place).start()
    try:
        assert native(place, "secret.h") == "value 42\n"
        assert probe(s, place, "secret.h") == "value 42\n"
        assert probe(s, place, "public.h") == "value 5\n"
    finally:
        s.stop()


def test_a_remote_tenants_build_cannot_read_the_servers_files(place):
    s = Server(place, tcp=True).start()
    try:
        out = probe(s, place, "secret.h")
        assert out.startswith("build -11") and "TOPSECRET" not in out, out
        # A remote tenant's headers are not on this host: none of the server's are read.
        out = probe(s, place, "public.h")
        assert out.startswith("build -11") and "Permission denied" in out, out
    finally:
        s.stop()


def test_the_sandbox_can_be_turned_off(place):
    cfg = place / "wormhole.toml"
    cfg.write_text("build_sandbox = false\n")
    s = Server(place, tcp=True, config=cfg).start()
    try:
        assert probe(s, place, "secret.h") == "value 42\n"
        assert "build sandbox off" in s.log.read_text()
    finally:
        s.stop()


def test_a_confined_build_reads_the_applications_own_headers(place):
    """The headers a build finds through its -I options are read on the application's side,
    with its rights, as natively, and the confined build reads those copies."""
    inc = place / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "top.h").write_text('#include "sub/deep.h"\n')
    (inc / "sub" / "deep.h").write_text("#define VALUE 11\n")
    (inc / "private.h").write_text("#define VALUE 13 /* TOPSECRET-c7 */\n")
    for p in [inc, inc / "sub", inc / "top.h", inc / "sub" / "deep.h"]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (inc / "private.h").chmod(0o600)
    (inc / "bad.h").write_text("#error wormhole-header-error\n")
    (inc / "bad.h").chmod(0o644)
    # The driver's own temporary file names differ from build to build.
    same = lambda out: re.sub(r"\S*tempfile_\w+", "tempfile", out)
    for server in [Server(place), Server(place, tcp=True)]:
        server.start()
        try:
            # clBuildProgram, and clCompileProgram then clLinkProgram.
            for user, how in [("nobody", []), (None, []), ("nobody", ["-c"]), (None, ["-c"])]:
                want = native(place, user=user, argv=how + ["-I", inc, "top.h"])
                assert want == f"options -I {inc}\nvalue 11\n"
                assert probe(server, place, user=user, argv=how + ["-I", inc, "top.h"]) == want
                # The log names the application's directories, the options are its own.
                want = native(place, user=user, argv=how + ["-I", "inc", "bad.h"])
                assert "error: inc/bad.h:1:2: wormhole-header-error" in want, want
                assert same(probe(server, place, user=user, argv=how + ["-I", "inc", "bad.h"])) == same(want)
            # A header the application's user may not read stays unread, as natively: the
            # build finds it and may not open it.
            for how in [[], ["-c"]]:
                want = native(place, user="nobody", argv=how + ["-I", inc, "private.h"])
                assert "private.h': Permission denied" in want, want
                out = probe(server, place, user="nobody", argv=how + ["-I", inc, "private.h"])
                assert "TOPSECRET" not in out and same(out) == same(want), out
            # Relative to the application's working directory.
            assert probe(server, place, argv=["-I", "inc", "top.h"]) == "options -I inc\nvalue 11\n"
        finally:
            server.stop()
