"""On a GPU machine: what on-demand builds cost and how they behave, in child processes on
an empty cache (``$AITER_AUX_CACHE_DIR``, default a fresh temporary directory).

* the first op call of a process in an empty cache (the binding, then the call's
  instance), wall time and the CPU time of the process and its compilers;
* a new key on that cache (one instance TU, compile and link);
* an op call that needs a build inside CUDA-graph capture: one clear error, and the
  capture after a warm-up call replays the reference's bytes.

Prints one JSON line per measurement, with the load average; ``--backend cpu`` measures
the CPU backend the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

CALLS = {
    "first_call": "import torch, aiter_aux\n"
    "aiter_aux.mxfp4_quant(torch.randn(4, 3072, device=DEV).bfloat16())\n",
    "new_key": "import torch, aiter_aux\n"
    "aiter_aux.mxfp4_quant(torch.randn(4, 3072, device=DEV).bfloat16())\n"
    "import time; t0 = time.perf_counter()\n"
    "ids = torch.randint(0, 13, (5, 3), device=DEV, dtype=torch.int32)\n"
    "aiter_aux.moe_sort(ids, torch.rand(5, 3, device=DEV), 13, 16)\n"
    "print('CALL_S', time.perf_counter() - t0)\n",
}

CAPTURE = """
import torch, aiter_aux
from aiter_aux import reference as ref
x = torch.randn(8, 1536, device="cuda").bfloat16()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        aiter_aux.mxfp4_quant(x)
    first = "captured"
except Exception as e:
    first = type(e).__name__ + ": " + str(e)
torch.cuda.synchronize()
q, s = aiter_aux.mxfp4_quant(x)  # the warm-up call builds it
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    q2, s2 = aiter_aux.mxfp4_quant(x)
g.replay()
torch.cuda.synchronize()
rq, rs = ref.mxfp4_quant(x.cpu())
ok = bool(torch.equal(q2.cpu(), rq) and torch.equal(s2.cpu(), rs))
print("CAPTURE", first.splitlines()[0][:400])
print("AFTER_WARMUP", ok)
"""


def child(code: str, env: dict) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "rc": p.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "loadavg": os.getloadavg(),
        "stdout": p.stdout[-2000:],
        "stderr": p.stderr[-3000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    dev = "'cuda'" if args.backend == "cuda" else "'cpu'"
    from aiter_aux import env as aux_env

    root = aux_env.get("AITER_AUX_CACHE_DIR") or tempfile.mkdtemp(prefix="aux_ondemand_")
    env = dict(os.environ, AITER_AUX_CACHE_DIR=root, PYTHONUNBUFFERED="1")
    for name, code in CALLS.items():
        got = child(code.replace("DEV", dev), env)
        print(json.dumps({"what": name, "backend": args.backend, "cores": os.cpu_count(), **got}))
    if args.backend == "cuda":
        print(json.dumps({"what": "capture", **child(CAPTURE, env)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
