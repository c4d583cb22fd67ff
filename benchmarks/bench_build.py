"""Build benchmark of module_moe_mxfp4_aux on the CPU backend (not a test).

Runs, each as a fresh ``aiter-aux`` process on a temporary COPY of the source tree
(``AITER_AUX_SOURCE_DIR``) with a temporary cache (``AITER_AUX_CACHE_DIR``), so neither the
repository nor your cache is touched:

1. cold build of the whole catalog,
2. no-op build,
3. ``add-shape`` of one new shape + its rebuild,
4. ``remove-shape`` of it + its rebuild,
5. first op in a fresh process: ``import torch`` (not ours, reported apart), then from
   ``import aiter_aux.ops`` to the first op's result (module lookup, sha256 check, dlopen,
   validation, the call), and the op call alone (a second call).

Goals on a 2-core machine: add-shape + rebuild <= 10 s, no-op <= 1 s, first op <= 0.5 s.

    python benchmarks/bench_build.py [--shape 160,5120,1536,8] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aiter_aux.catalog_edit import read_catalog  # noqa: E402 (stdlib only)

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"no-op build": 1.0, "add-shape + rebuild": 10.0, "first op (aiter_aux)": 0.5}

FIRST_OP = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from aiter_aux.ops import moe_mxfp4_aux as ops
t2 = time.perf_counter()
x = torch.ones(4, int(sys.argv[1]), dtype=torch.bfloat16)
t3 = time.perf_counter()
ops.mxfp4_quant(x)
t4 = time.perf_counter()
ops.mxfp4_quant(x)
t5 = time.perf_counter()
print(json.dumps({"torch": t1 - t0, "import": t2 - t1, "first": t4 - t3, "call": t5 - t4}))
"""


def copy_tree(dst: Path) -> Path:
    """The sources a build reads, plus the ops-side catalog that add-shape edits."""
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, dst / sub, ignore=shutil.ignore_patterns("__pycache__"))
    ops = Path("aiter_aux/ops/moe_mxfp4_aux.py")
    (dst / ops).parent.mkdir(parents=True)
    shutil.copy2(ROOT / ops, dst / ops)
    return dst


def run(env: dict, *args: str) -> tuple[float, str]:
    """Wall time of one command (process start to exit) and its stdout."""
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return wall, p.stdout


def cli(env: dict, *args: str) -> tuple[float, str]:
    return run(env, sys.executable, "-m", "aiter_aux.cli", *args)


def compiled(out: str) -> str:
    m = re.search(r"(\d+) translation units compiled", out)
    return m.group(1) if m else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="160,5120,1536,8", help="the shape to add/remove")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="aiter_aux_bench_"))
    tree = copy_tree(tmp / "tree")
    env = dict(os.environ, AITER_AUX_SOURCE_DIR=str(tree), AITER_AUX_CACHE_DIR=str(tmp / "cache"),
               AITER_AUX_BACKEND="cpu")  # fmt: skip
    for name in ("AITER_AUX_REBUILD", "AITER_AUX_DISABLE_JIT", "AITER_AUX_VERBOSE"):
        env.pop(name, None)
    rows = []
    print(f"aiter-aux build benchmark: {os.cpu_count()} CPUs, sources copied to {tree}")
    wall, out = cli(env, "build")
    rows.append(("cold build (whole catalog)", wall, compiled(out)))
    wall, out = cli(env, "build")
    rows.append(("no-op build", wall, compiled(out)))
    wall, out = cli(env, "add-shape", args.shape, "--note", "bench_build")
    rows.append(("add-shape + rebuild", wall, compiled(out)))
    wall, out = cli(env, "remove-shape", args.shape)
    rows.append(("remove-shape + rebuild", wall, compiled(out)))
    d = read_catalog(tree / "codegen" / "catalog.py", "SHAPES")[0][1]
    wall, out = run(env, sys.executable, "-c", FIRST_OP, str(d))
    t = json.loads(out.strip().splitlines()[-1])
    rows += [("first op: import torch (not ours)", t["torch"], "-"),
             ("first op (aiter_aux)", t["import"] + t["first"], "-"),
             ("  import aiter_aux.ops", t["import"], "-"),
             ("  first call (finds + loads module)", t["first"], "-"),
             ("  a later call (the op alone)", t["call"], "-"),
             ("first-op process, total wall", wall, "-")]  # fmt: skip
    print(f"\n{'step':<36} {'wall s':>8} {'TUs compiled':>13} {'goal s':>7}  ok")
    for name, sec, tus in rows:
        goal = GOALS.get(name)
        ok = "" if goal is None else ("yes" if sec <= goal else "NO")
        print(f"{name:<36} {sec:>8.3f} {tus:>13} {goal or '':>7}  {ok}")
    if args.keep:
        print(f"\nkept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
