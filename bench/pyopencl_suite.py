"""Wall time of PyOpenCL's own test suite, natively on PoCL and through Wormhole (shared
memory), alternating, in one run: the real-application row of the benchmark.

    .venv/bin/python bench/pyopencl_suite.py [--rounds N]

The suite is the one scripts/install.sh fetches (target/pyopencl-src). The first native run
also fills PoCL's kernel cache, which both sides then share, so it is reported but not
compared; every later round compares warm with warm. Outcomes must match (the tests check
that too); a difference is printed.
"""

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import Server  # noqa: E402
from test_pyopencl_suite import SUITE, run_suite  # noqa: E402


def timed(prefix, junit, env):
    t = time.monotonic()
    outcomes = run_suite(prefix, junit, env)
    return time.monotonic() - t, outcomes


def counts(outcomes):
    c = {}
    for o, _ in outcomes.values():
        c[o] = c.get(o, 0) + 1
    return " ".join(f"{k} {v}" for k, v in sorted(c.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="warm rounds after the warm-up (default 2)")
    args = ap.parse_args()
    if not SUITE.is_dir():
        sys.exit("run scripts/install.sh first (it fetches PyOpenCL's tests)")
    import os

    native_env = {k: v for k, v in os.environ.items() if k != "WORMHOLE_SOCKET"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        server = Server(tmp).start()
        try:
            warm, _ = timed([], tmp / "warm.xml", native_env)
            print(f"warm-up (native, fills PoCL's kernel cache): {warm:.1f} s", file=sys.stderr)
            rows = []
            for i in range(args.rounds):
                n, no = timed([], tmp / f"n{i}.xml", native_env)
                w, wo = timed(server.cmd([]), tmp / f"w{i}.xml", server.env())
                rows.append((n, w, no, wo))
        finally:
            server.stop()
    print("PyOpenCL test suite (warm PoCL kernel cache)    native s   wh-shm s   shm/nat")
    for i, (n, w, no, wo) in enumerate(rows):
        print(f"round {i + 1:<42}{n:9.1f}  {w:9.1f}  {w / n:7.2f}x")
        diff = [k for k in no if wo.get(k, ("missing",))[0] != no[k][0]]
        print(f"  outcomes native: {counts(no)}; wormhole: {counts(wo)}; differing: {len(diff)}")
        for k in diff[:10]:
            print(f"    {k}: native {no[k][0]}, wormhole {wo.get(k, ('missing',))[0]}")
    best_n, best_w = min(r[0] for r in rows), min(r[1] for r in rows)
    print(f"{'best of rounds':<48}{best_n:9.1f}  {best_w:9.1f}  {best_w / best_n:7.2f}x")


if __name__ == "__main__":
    main()
