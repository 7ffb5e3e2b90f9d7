"""Unmodified C programs give the same results through Wormhole as natively."""

import subprocess

import pytest

PROGRAMS = ["vector_add", "multithread", "callbacks", "errors", "svm", "svm_fine", "bulk"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_native_baseline(c_programs, name):
    r = subprocess.run([c_programs[name]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", PROGRAMS)
def test_through_wormhole(any_server, c_programs, name):
    # STRICT=1: also the checks the spec requires that PoCL itself skips (wrong-kind handles,
    # an empty dispatch slot), which Wormhole answers with the proper error.
    r = any_server.run([c_programs[name]], STRICT="1")
    assert r.returncode == 0, r.stdout + r.stderr
    if name == "vector_add":
        assert "Wormhole \u2192" in r.stdout
        assert "OK, checksum 1649265868800" in r.stdout


def test_repeated_sessions_are_independent(server, c_programs):
    for _ in range(3):
        r = server.run([c_programs["vector_add"]])
        assert r.returncode == 0, r.stderr
