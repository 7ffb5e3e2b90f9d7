"""A kernel's printf reaches the application's own stdout, in order with the host's output,
through every transport: the lines a kernel prints are there when the synchronisation point
that waited for it returns (clFinish, clWaitForEvents, a blocking read or map, the event's
status, its callback), and arrive by themselves when the host does not synchronise. Nothing
of them lands in the server's output or log."""

import subprocess

import pytest

from conftest import Server


@pytest.fixture(params=["shm", "tcp", "tls", "ivshmem"])
def transport(request, tmp_path):
    s = Server(tmp_path, tcp=request.param == "tcp", tls=request.param == "tls",
               guest=request.param == "ivshmem").start()
    yield s
    s.stop()


def native(c_programs, *args):
    r = subprocess.run([c_programs["kernel_printf"], *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def through(server, c_programs, *args):
    r = server.run([c_programs["kernel_printf"], *args], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def assert_nothing_in_server(server):
    for f in (server.out, server.log):
        text = f.read_text() if f.exists() else ""
        assert "kernel " not in text and "hello" not in text, f"{f.name}: {text[-2000:]}"


def test_printf_in_order_at_every_synchronisation_point(transport, c_programs):
    want = native(c_programs)
    # The sequence exercises every kind of synchronisation point.
    assert want.count("says hello") == 6 and want.endswith("host: after the callback\n"), want
    got = through(transport, c_programs)
    assert got.splitlines() == want.splitlines()
    assert got == want
    assert_nothing_in_server(transport)


def test_printf_arrives_without_synchronisation(transport, c_programs):
    want = native(c_programs, "async")
    assert want.startswith("kernel 7 item 0 of 3") and want.endswith("host: after sleeping\n"), want
    assert through(transport, c_programs, "async") == want
    assert_nothing_in_server(transport)


def test_printf_follows_the_applications_redirected_stdout(server, c_programs, tmp_path):
    native_file, wh_file = tmp_path / "native.txt", tmp_path / "wh.txt"
    want_out = native(c_programs, "file", str(native_file))
    got_out = through(server, c_programs, "file", str(wh_file))
    assert want_out == f"host: writing to {native_file}\n"
    assert got_out == f"host: writing to {wh_file}\n"
    want = native_file.read_text()
    assert "kernel 5 item 15 of 16" in want
    assert wh_file.read_text() == want
    assert_nothing_in_server(server)
