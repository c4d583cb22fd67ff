"""Compile the GPU kernel instances of the catalog for AMD and NVIDIA targets, no GPU needed.

    python scripts/compile_check.py [--targets gfx950,gfx942,sm_90] [--jobs N] [--all-instances]

The catalog's instances are rendered by the codegen (the same TUs the JIT builds), bundled
one TU per op (each instance TU #included once), and compiled.  By default a representative
set (:func:`representative`: per op every distinct model_dim, the smallest and largest
num_experts, the largest topk, odd and even topk); ``--all-instances`` compiles the whole
catalog.

* gfx950 / gfx942: Debian's clang-22 with libamdhip64-dev, device code only, to assembly
  (``-S``: unlike ``-fsyntax-only`` it runs the backend, which catches target-feature
  errors).  The gfx950 assembly of the MXFP4 quantising ops must contain
  ``v_cvt_scalef32_pk_fp4_bf16`` (the hardware scaled fp4 conversion) and gfx942's must not.
  The MXFP8 ops (``mxfp8_quant``, ``moe_sort_quant_fp8``) take the exact software E4M3 path
  on every AMD target: their assembly must hold no fp4 or fp8 conversion instruction.
* gfx950 / gfx942: no register spills and no scratch memory (each kernel's resources come
  from ``-Rpass-analysis=kernel-resource-usage``).  sm_90 (ptxas ``-warn-spills``): spills
  are printed as notes, not failures: the H200-tuned occupancy bounds spill a few bytes in
  mxfp4_quant and moe_sort_quant's wide mid-path kernel (D = 4096, 8192: 4 bytes at 6
  and 3 blocks per SM) and in the 64-bit-index scatter_q kernel (> 2^31 units only);
  moe_sort_scales' decode kernel at D = 7168 (8-byte slots) spills 4 bytes with its PDL
  trigger after the loop (none with -DAITER_AUX_PDL_EARLY_TRIGGER=1); the large sort's scan
  kernel spills 8 bytes at the 32 registers ptxas picks for it (its own choice: the kernel
  has no minimum-blocks bound); moe_route's grouped warp-per-row kernel of 16 columns per
  lane (E 257–512 from 256 rows) spills 8 bytes.
* sm_90: nvcc ``-cubin`` (through ptxas; cicc's front end checks the host code, the host
  compiler is not run); the PTX of that compile (kept with ``--keep``) must contain, for
  the MXFP8 ops, ``cvt.rn.satfinite.e4m3x2.f32`` (their hardware conversion,
  gpu/quant_fp8.h), and for every op of the op table (``PDL_OPS``) a grid-dependency wait
  (``griddepcontrol.wait``, gpu/target_ops.h PdlScope) in each of its kernels.
  The CUDA backend's binding TU is checked by the host compiler (``-fsyntax-only
  -DUSE_CUDA`` against torch's headers).  The device-side tools ``gpu/tests/sort_sweep.cu``,
  ``decode_sweep.cu`` and ``scatter_sweep.cu`` are compiled too (they call the sort's
  per-path launch functions, the decode kernel's parts and the reduce's small-M launch
  shapes).

Prints a table; exits 1 on any failure.  Install the AMD compiler with
``apt-get install clang-22 libamdhip64-dev`` (bookworm-security).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiter_aux import env  # noqa: E402
from aiter_aux.jit.paths import codegen_module, kernels_dir  # noqa: E402

HW_FP4 = "v_cvt_scalef32_pk_fp4_bf16"
QUANTISING_OPS = ("mxfp4_quant", "moe_sort_quant")
FP8_OPS = ("mxfp8_quant", "moe_sort_quant_fp8")
AMD_FP8_CVT = ("v_cvt_scalef32_pk_fp8", "v_cvt_pk_fp8", "v_cvt_scalef32_fp8", "v_cvt_sr_fp8")
PTX_FP8 = "cvt.rn.satfinite.e4m3x2.f32"
# ops whose every kernel waits on its grid dependency (gpu/target_ops.h PdlScope) on sm_90
PDL_OPS = tuple(codegen_module("ops").OPS)  # every op: each GPU kernel opens with a PdlScope
PTX_PDL_WAIT = "griddepcontrol.wait"


def amd_command(arch: str, src: Path, out: Path) -> list[str]:
    return [
        env.get("HIP_CLANG"), "-x", "hip", f"--offload-arch={arch}",
        "--rocm-path=/usr", "-nogpulib", "-D__AMDGCN_WAVEFRONT_SIZE=64", "-std=c++17", "-O3",
        "--cuda-device-only", "-S", "-Wall", "-Rpass-analysis=kernel-resource-usage",
        f"-I{kernels_dir()}", str(src), "-o", str(out),
    ]  # fmt: skip


def _nvcc() -> str:
    return env.get("AITER_AUX_NVCC") or "nvcc"


def keep_dir(workdir: Path, arch: str, op: str) -> Path:
    """Where nvcc keeps the intermediate files (the PTX among them) of one compile."""
    return workdir / f"keep.{op}.{arch}"


def cuda_command(arch: str, src: Path, out: Path, keep: Path | None = None) -> list[str]:
    """nvcc -cubin of one TU (cicc's front end checks the host code too; the host compiler,
    which the JIT runs, adds nothing to check here); ``keep``: a directory for its
    intermediate files (PTX included)."""
    return [
        _nvcc(), "-std=c++17", "-O3",
        f"-gencode=arch=compute_{arch[3:]},code={arch}", "-Xptxas", "-warn-spills", "-x", "cu",
        f"-I{kernels_dir()}", "-cubin", str(src), "-o", str(out),
    ] + (["--keep", f"--keep-dir={keep}"] if keep else [])  # fmt: skip


def representative(instances: list) -> list:
    """Per op, the fewest instances (greedy cover) that between them hold every distinct
    model_dim of the op's instances (the fused sort+quant ops: the smallest and largest),
    its smallest and largest num_experts, its largest topk and an odd and an even topk: what
    a compile can depend on (the D-dependent quant and scatter code, the E-sized shared
    memory, the topk loops and their parity).  The fused ops' quant blocks are the quant
    ops' code, which the quant ops compile for every model_dim.  An op without compile-time
    parameters has one instance: it is always chosen (a composed op has none: the op
    table's ``composes``)."""
    chosen = []
    by_op: dict[str, list] = {}
    for inst in instances:
        by_op.setdefault(inst.op, []).append(inst)
    for insts in by_op.values():
        if not insts[0].params:  # one instance serves every shape (moe_sum)
            chosen += insts
            continue

        def features(inst) -> set:
            p = inst.params
            f = set()
            if "model_dim" in p:
                f.add(("d", p["model_dim"]))
            if "num_experts" in p:
                f.add(("e", p["num_experts"]))
            if "topk" in p:
                f |= {("k", p["topk"]), ("k odd", p["topk"] % 2)}
            return f

        fused = {"num_experts", "model_dim"} <= set(insts[0].params)
        want = set()
        extremes = (("e", "num_experts"),) + ((("d", "model_dim"),) if fused else ())
        for name, key in extremes:
            values = [i.params[key] for i in insts if key in i.params]
            if values:
                want |= {(name, min(values)), (name, max(values))}
        topks = [i.params["topk"] for i in insts if "topk" in i.params]
        if topks:
            want.add(("k", max(topks)))
        kinds = ("k odd",) if fused else ("d", "k odd")
        want |= {f for i in insts for f in features(i) if f[0] in kinds}
        while want:
            best = max(insts, key=lambda i: (len(features(i) & want), i.key))
            if not features(best) & want:
                break
            chosen.append(best)
            want -= features(best)
    return sorted(chosen)


def bundles(workdir: Path, backend: str, every: bool = False) -> dict[str, tuple[Path, int]]:
    """One TU per op including the catalog's instances of that op (``every``: all of them,
    else :func:`representative`): op -> (path, count)."""
    gen = codegen_module("gen_instances")
    catalog = codegen_module("instances").enumerate_instances(codegen_module("catalog").SHAPES)
    srcdir = workdir / backend
    result = gen.generate(srcdir, backend)
    keep = {i.key for i in (catalog if every else representative(catalog))}
    by_op: dict[str, list[Path]] = {}
    for inst, path in zip(catalog, sorted(result.instance_files), strict=True):
        assert path.stem == f"inst_{inst.key}", (path, inst.key)
        if inst.key in keep:
            by_op.setdefault(inst.op, []).append(path)
    ext = ".hip" if backend == "rocm" else ".cu"
    out = {}
    for op, paths in by_op.items():
        bundle = srcdir / f"bundle_{op}{ext}"
        bundle.write_text("".join(f'#include "{p.name}"\n' for p in paths))
        out[op] = (bundle, len(paths))
    return out


_SPILL_REMARKS = re.compile(r"(ScratchSize \[bytes/lane\]|VGPRs Spill|SGPRs Spill): ([0-9]+)")


def spills(stderr: str, amd: bool) -> list[str]:
    """Register spills / scratch use reported by the compiler (AMD: the kernel-resource-usage
    remarks; nvcc: ptxas -warn-spills)."""
    if amd:
        return [
            f"{m.group(1)}: {m.group(2)}"
            for m in _SPILL_REMARKS.finditer(stderr)
            if m.group(2) != "0"
        ]
    return [ln.strip() for ln in stderr.splitlines() if "spill" in ln.lower()]


def run_one(target: str, op: str, src: Path, count: int, workdir: Path) -> tuple:
    amd = target.startswith("gfx")
    out = workdir / f"{op}.{target}.{'s' if amd else 'cubin'}"
    if amd:
        cmd = amd_command(target, src, out)
    else:
        keep = keep_dir(workdir, target, op)
        keep.mkdir()
        cmd = cuda_command(target, src, out, keep)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    problems, spilled = [], []
    if p.returncode:
        problems.append(f"compile failed:\n{' '.join(cmd)}\n{p.stderr[-3000:]}")
    elif (spilled := spills(p.stderr, amd)) and amd:
        problems.append(
            f"register spills / scratch ({len(spilled)}): " + "; ".join(sorted(set(spilled)))
        )
    elif amd:
        asm = out.read_text()
        n_hw = asm.count(HW_FP4)
        if target == "gfx950" and op in QUANTISING_OPS and n_hw == 0:
            problems.append(f"{HW_FP4} missing from the gfx950 assembly")
        if target != "gfx950" and n_hw:
            problems.append(f"{HW_FP4} in {target} assembly (gfx950-only instruction)")
        if op in FP8_OPS and (n_hw or any(i in asm for i in AMD_FP8_CVT)):
            problems.append(
                f"a hardware fp4/fp8 conversion in the {target} assembly of {op} "
                "(its software E4M3 path is the one proven equal to the spec)"
            )
    elif op in FP8_OPS or op in PDL_OPS:
        # the PTX that went into the object (nvcc --keep): the same cicc run, not a second one
        ptx = keep_dir(workdir, target, op) / f"{src.stem}.ptx"
        if not ptx.is_file():
            problems.append(f"no PTX kept by nvcc for {op} ({ptx} missing)")
        else:
            text = ptx.read_text()
            if op in FP8_OPS and PTX_FP8 not in text:
                problems.append(f"{PTX_FP8} missing from the {target} PTX of {op}")
            entries = text.split(".entry ")[1:]
            no_wait = sum(PTX_PDL_WAIT not in e for e in entries)
            if op in PDL_OPS and (not entries or no_wait):
                problems.append(f"{no_wait} of {len(entries)} kernels of {op} lack {PTX_PDL_WAIT}")
    if spilled and not amd:  # known on sm_90 (see the docstring): reported, not failed
        print(f"note: {target} {op}: " + "; ".join(sorted(set(spilled))), file=sys.stderr)
    warnings = p.stderr.count("warning:")
    return target, op, count, secs, warnings, problems


# Device-side development tools built by hand on the GPU machine: compiled here so that they
# keep up with the kernels' internal API (with their extra flags: scatter_sweep.cu for one
# model_dim, as scripts/scatter_sweep.sh builds it).
TOOLS = tuple(
    (kernels_dir() / "gpu" / "tests" / t, flags)
    for t, flags in (
        ("sort_sweep.cu", ()),
        ("decode_sweep.cu", ()),
        ("scatter_sweep.cu", ("-DSWEEP_DIM=7168",)),
    )
)


def compile_tool(src: Path, flags: tuple[str, ...], work: Path) -> tuple:
    """nvcc -ptx of a tool TU, unoptimised: (target, name, 1, seconds, warnings, problems).
    The tools only need to keep compiling against the kernels' internal API: cicc's front end
    checks the whole TU, host code included (a bad call of a launch function fails), and
    ``-Xcicc -O0 -ptx`` skips the optimiser, ptxas and the host compiler (sort_sweep.cu: 6 s
    instead of 58); optimised code is what the instances' compiles check."""
    t0 = time.perf_counter()
    out = work / (src.stem + ".ptx")
    cmd = [_nvcc(), "-std=c++17", "-O0", "-Xcicc", "-O0", "-arch=sm_90", *flags, "-I",
           str(kernels_dir()), "-ptx", str(src)]  # fmt: skip
    proc = subprocess.run(cmd + ["-o", str(out)], capture_output=True, text=True)
    problems = [] if proc.returncode == 0 else [f"{src.name}: {proc.stderr.strip()[-2000:]}"]
    return ("sm_90", src.name, 1, time.perf_counter() - t0, 0, problems)


def compile_cuda_binding(work: Path) -> tuple:
    """The CUDA backend's binding TU (host code: the checks, the instance lookups, a composed
    op's launches of its parts), checked by the host compiler against torch's headers with
    ``USE_CUDA`` (the JIT compiles it the same way): (target, name, 0, seconds, 0,
    problems)."""
    from torch.utils.cpp_extension import include_paths

    t0 = time.perf_counter()
    src = work / "binding_cuda.cpp"
    src.write_text(codegen_module("render").Renderer("cuda").render_binding())
    cuda_inc = Path(shutil.which(_nvcc()) or "nvcc").resolve().parents[1] / "include"
    incs = [f"-I{p}" for p in (str(kernels_dir()), *include_paths(), str(cuda_inc))]
    cmd = [env.get("CXX") or "g++", "-std=c++17", "-fsyntax-only", "-DUSE_CUDA", *incs,
           str(src)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    problems = [] if proc.returncode == 0 else [f"{src.name}: {proc.stderr.strip()[-2000:]}"]
    return ("sm_90", "binding (cuda)", 0, time.perf_counter() - t0, 0, problems)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="gfx950,gfx942,sm_90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    every = "every instance of the catalog (default: a representative set)"
    ap.add_argument("--all-instances", action="store_true", help=every)
    args = ap.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    need = {env.get("HIP_CLANG") if t.startswith("gfx") else _nvcc() for t in targets}
    missing = [c for c in need if not shutil.which(c)]
    if missing:
        print(f"compile_check: missing compilers {missing}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aiter_aux_cc_") as tmp:
        work = Path(tmp)
        jobs = []
        for backend in sorted({"rocm" if t.startswith("gfx") else "cuda" for t in targets}):
            for op, (src, count) in bundles(work, backend, args.all_instances).items():
                for t in targets:
                    if t.startswith("gfx") == (backend == "rocm"):
                        jobs.append((t, op, src, count, work))
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda j: run_one(*j), jobs))
        if "sm_90" in targets:
            results += [compile_tool(tool, flags, work) for tool, flags in TOOLS]
            results.append(compile_cuda_binding(work))
    print(f"{'target':<8} {'op':<22} {'instances':>9} {'seconds':>8} {'warnings':>8}  result")
    failed = 0
    for target, op, count, secs, warnings, problems in sorted(results):
        failed += bool(problems)
        status = "ok" if not problems else "FAIL"
        print(f"{target:<8} {op:<22} {count:>9} {secs:>8.1f} {warnings:>8}  {status}")
        for p in problems:
            print("    " + p.replace("\n", "\n    "))
    n = sum(r[2] for r in results)
    print(f"{n} instance compilations for {targets} in {time.perf_counter() - t0:.0f} s: "
          f"{'all ok' if not failed else f'{failed} FAILED'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
