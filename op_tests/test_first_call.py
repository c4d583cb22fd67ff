"""What the first op call of a process does: the files it enters, what it imports, that
concurrent first calls all run, and that the package has no import circle.  CPU backend.

The measure of the load path (:data:`TRACE`): in a process that has imported
``aiter_aux.ops`` and torch, the first call ``aiter_aux.ops.mxfp4_quant(x)`` runs under
``sys.setprofile``.  A *file entry* is a Python call whose code lives in a project file
(``aiter_aux/**`` or the source root's ``codegen/**``; a module body run by an import
counts) made from a different project file (the nearest project frame up the stack; torch's
dispatcher in between does not count).  ``files`` are the distinct project files entered,
``reentries`` the entries of a file already entered before.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from instance_counts import n_tus  # noqa: E402 (op_tests/instance_counts.py)
from test_load_path import env_for, last_json, make_sources, py  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_FILES = 9  # a cache-hit first call enters at most this many project files (the module's
# load path and the loader of the C++ autograd kernel, jit/written_versions.py)

TRACE = """
import json, os, sys
from pathlib import Path
import torch
import aiter_aux
from aiter_aux import ops as aux_ops
from aiter_aux.jit.paths import source_root

ROOTS = (str(Path(aiter_aux.__file__).resolve().parent) + os.sep,
         str(source_root().resolve() / "codegen") + os.sep)

def project(frame):
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(ROOTS):
            return name
        frame = frame.f_back
    return None

entered, reentries = [], 0

def profile(frame, event, arg):
    global reentries
    if event != "call" or not frame.f_code.co_filename.startswith(ROOTS):
        return
    name = frame.f_code.co_filename
    if project(frame.f_back) != name:
        if name in entered:
            reentries += 1
        else:
            entered.append(name)

x = torch.randn(4, 3072).bfloat16()
before = set(sys.modules)
sys.setprofile(profile)
aux_ops.mxfp4_quant(x)
sys.setprofile(None)
short = [n.replace(ROOTS[0], "aiter_aux/").replace(ROOTS[1], "codegen/") for n in entered]
print(json.dumps({"files": short, "reentries": reentries,
                  "imported": sorted(set(sys.modules) - before)}))
"""


FIRST = """
import json
import torch
from aiter_aux import ops as aux_ops
from aiter_aux.ops import _library
aux_ops.mxfp4_quant(torch.randn(2, 3072).bfloat16())
print(json.dumps({"written_versions": _library.register_written_versions()}))
"""


@pytest.fixture(scope="module")
def first_build(tmp_path_factory):
    """A one-shape catalog built by the first op call of a process (two compile jobs, so
    the autograd kernel builds alongside): (env, its stderr, its result)."""
    tmp = tmp_path_factory.mktemp("first_call")
    env = env_for(tmp / "cache", make_sources(tmp / "src"), MAX_JOBS="2")
    p = py(FIRST, env)
    return env, p.stderr, last_json(p)


@pytest.fixture
def built(first_build):
    """The env of a one-shape catalog whose instance of the first call is in the cache, in
    an instance library built on demand (so a first call is a hit)."""
    return first_build[0]


@pytest.fixture
def catalog_built(first_build):
    """The same env with the catalog's module built (`aiter-aux build`)."""
    env = first_build[0]
    subprocess.run([sys.executable, "-m", "aiter_aux.cli", "build"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return env


def test_first_call_that_compiles_says_so_once(first_build):
    """One line before the build: what it compiles, about how long here, how to avoid it."""
    env, err, _ = first_build
    notes = [ln for ln in err.splitlines() if "op call of this process compiles" in ln]
    assert len(notes) == 1, err
    note = notes[0]
    assert note.startswith(
        "aiter_aux: the first cpu op call of this process compiles the "
        f"binding and the kernels ({n_tus(0)} of {n_tus(0)} translation units, about "
    ), note
    assert re.search(r"about \d+ (s|min) on \d+ cores?( at load [\d.]+)?\) into ", note), note
    assert env["AITER_AUX_CACHE_DIR"] in note, note
    assert re.search(
        r"then each instance as it is first called \((under a second|about \d+ s) " r"each\)", note
    ), note
    assert "run `aiter-aux build` ahead of time or install the prebuilt wheel" in note, note
    built = [ln for ln in err.splitlines() if "building instance" in ln]
    assert len(built) == 1 and "mxfp4_quant_d3072" in built[0], err  # that call's alone
    assert err.index(note) < err.index(built[0]), err  # said first


def test_first_call_builds_the_autograd_kernel_alongside_and_says_so(first_build):
    """The note names the autograd kernel's directory; one line says when it is built; the
    ops then have the C++ kernel (register_written_versions says None, not why Python)."""
    env, err, got = first_build
    from aiter_aux.jit import written_versions

    note = next(ln for ln in err.splitlines() if "op call of this process compiles" in ln)
    where = Path(env["AITER_AUX_CACHE_DIR"]) / written_versions.DIR_PREFIX
    assert f" and, alongside, the ops' autograd kernel into {where}" in note, note
    done = [ln for ln in err.splitlines() if "the autograd kernel" in ln and " is built in " in ln]
    assert len(done) == 1 and written_versions.SOURCE in done[0], err
    assert err.index(note) < err.index(done[0]), err
    assert got == {"written_versions": None}, (got, err)


def test_first_call_builds_no_autograd_kernel_alongside_with_one_job(tmp_path):
    """``MAX_JOBS=1``: one compile at a time, so the autograd kernel is built after the
    module, as the ops register it, and the note says so (not "alongside")."""
    from aiter_aux.jit import written_versions

    env = env_for(tmp_path / "cache", make_sources(tmp_path / "src"), MAX_JOBS="1")
    p = py(FIRST, env)
    assert last_json(p) == {"written_versions": None}, p.stderr
    note = next(ln for ln in p.stderr.splitlines() if "op call of this process compiles" in ln)
    where = Path(env["AITER_AUX_CACHE_DIR"]) / written_versions.DIR_PREFIX
    assert "alongside" not in note and f", then the ops' autograd kernel into {where}" in note


def test_cache_hit_first_call_enters_few_files_and_imports_no_generator(catalog_built):
    got = last_json(py(TRACE, catalog_built))
    assert len(got["files"]) <= MAX_FILES, got
    imported = got["imported"]
    for heavy in ("jinja2", "ninja", "aiter_aux.jit.build", "aiter_aux_codegen.render"):
        assert heavy not in imported, (heavy, imported)


def test_instance_library_hit_imports_no_generator_nor_builder(built):
    """The module of no shape and the call's instance library, both from the cache: the
    library's inputs are digested from the files, nothing is rendered or built."""
    got = last_json(py(TRACE, built))
    assert len(got["files"]) <= MAX_FILES + 2, got  # + the library lookup: ondemand, includes
    imported = got["imported"]
    for heavy in ("jinja2", "ninja", "aiter_aux.jit.build", "aiter_aux_codegen.render"):
        assert heavy not in imported, (heavy, imported)


# ------------------------------------------------------------ concurrent first calls (N1)
# Every op, both forms, 8 threads each, released at once as the process's first op call.
# The inputs come from the reference (no module involved); the _out buffers get the
# shapes of the fake implementation (meta tensors, no module either).
THREADS = """
import json, threading
import torch
import aiter_aux.ops  # defines the ops
from aiter_aux import reference as ref
from aiter_aux.pipeline import draw_routing

E, D, K, BM, M = 256, 3072, 8, 32, 5
g = torch.Generator().manual_seed(0)
ids, w = draw_routing(M, E, K, g)
x = torch.randn(M, D, generator=g).bfloat16()
s = ref.moe_sort(ids, w, E, BM)
_, a_scale = ref.mxfp4_quant(x)
expert_out = torch.randn(ref.moe_sort_capacity(M, K, E, BM), D, generator=g).bfloat16()
eq, es = ref.mxfp4_quant(expert_out)
ARGS = {
    "moe_sort": (ids, w, E, BM),
    "mxfp4_quant": (x,),
    "mxfp8_quant": (x,),
    "moe_sort_quant": (ids, w, x, E, BM),
    "moe_sort_quant_fp8": (ids, w, x, E, BM),
    "moe_sort_scales": (a_scale, s.sorted_token_ids, s.num_valid_ids, BM),
    "moe_scatter_reduce": (expert_out, s.reverse_sorted, s.sorted_weights, K),
    "moe_scatter_reduce_q": (eq, es, s.reverse_sorted, s.sorted_weights, K),
}
ops = torch.ops.aiter_aux
calls = []
for name, args in ARGS.items():
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    outs = getattr(ops, name)(*meta)
    outs = outs if isinstance(outs, tuple) else (outs,)
    bufs = [torch.empty(o.shape, dtype=o.dtype) for o in outs]
    calls.append((name, getattr(ops, name), args))
    calls.append((name + "_out", getattr(ops, name + "_out"), (*args, *bufs)))
calls = [c for c in calls for _ in range(8)]
barrier = threading.Barrier(len(calls))
failures = []

def run(name, op, args):
    barrier.wait()
    try:
        op(*args)
    except Exception as e:
        failures.append(f"{name}: {type(e).__name__}: {e}")

threads = [threading.Thread(target=run, args=c) for c in calls]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"calls": len(calls), "failures": failures[:3], "failed": len(failures)}))
"""


@pytest.mark.robust
def test_concurrent_first_calls_all_run(built):
    """N1: every thread waits for the one load, then runs (5 fresh processes)."""
    for _round in range(5):
        got = last_json(py(THREADS, built))
        assert got["calls"] == 128 and got["failed"] == 0, got


# ----------------------------------------------------------------------- import circles
def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None) if isinstance(child, ast.If) else None
            if test is not None and "TYPE_CHECKING" in ast.unparse(test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere (module level or inside functions)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            # the longest project module the target names (a submodule, else its package)
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                break
    return found


def import_cycles() -> list[list[str]]:
    files = sorted((ROOT / "aiter_aux").rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules) for f in files}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circle():
    """Imports inside functions count: they close a circle as surely, only later (those
    under ``if TYPE_CHECKING:`` never run and do not)."""
    assert import_cycles() == []


def test_cycle_finder_sees_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "aiter_aux"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (pkg / "a.py").write_text("from . import b, c\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_cycles() == [["aiter_aux.a", "aiter_aux.b"]]


def test_trace_counts_the_issue_measure():
    """The measure itself, on a toy call chain a -> b -> a -> b: 2 files, 2 re-entries
    (returns are no entries)."""
    code = TRACE.split("x = torch.randn")[0] + (
        "import types\n"
        "def make(name, body):\n"
        "    m = types.ModuleType(name)\n"
        "    exec(compile(body, ROOTS[0] + name + '.py', 'exec'), m.__dict__)\n"
        "    return m\n"
        "b = make('b', 'def g(f):\\n    return f() if f else 1\\n')\n"
        "a = make('a', 'def f(g, h):\\n    return g(h)\\ndef h():\\n    return B.g(None)\\n')\n"
        "a.B = b\n"
        "sys.setprofile(profile)\n"
        "a.f(b.g, a.h)\n"
        "sys.setprofile(None)\n"
        "print(json.dumps({'files': [n[-4:] for n in entered], 'reentries': reentries}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {
        "files": ["a.py", "b.py"],
        "reentries": 2,
    }, p.stderr


def test_first_build_note_when_every_object_exists(tmp_path):
    """Objects from an earlier build whose sources changed: not "0 of N" but the bound."""
    from aiter_aux.jit.progress import first_build_note, module_units

    (tmp_path / "obj").mkdir()
    for n in module_units("cpu"):
        (tmp_path / "obj" / f"{n}.o").write_text("")
    note = first_build_note("cpu", tmp_path)
    assert f"up to {len(module_units('cpu'))} translation units: the sources changed" in note
    assert " 0 of " not in note


def test_first_build_note_scales_with_the_load(tmp_path, monkeypatch):
    """The estimate is CPU time stretched by the share of a core a busy machine leaves: at
    load 10 on 2 cores about 5.5 times an idle machine's, and the note says the load."""
    import os

    from aiter_aux.jit import progress

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    idle = progress.first_build_note("cpu", tmp_path)
    monkeypatch.setattr(os, "getloadavg", lambda: (10.0, 10.0, 10.0))
    busy = progress.first_build_note("cpu", tmp_path)
    cost = progress.COMPILE_CPU_S["cpu"]["module"]
    assert f"about {progress._duration(cost)} on 2 cores)" in idle, idle
    assert f"about {progress._duration(cost * 11 / 2)} on 2 cores at load 10.0)" in busy, busy
    each = progress.COMPILE_CPU_S["cpu"]["instance"] * 11 / 2
    assert f"(about {progress._duration(each)} each)" in busy, busy


def test_first_build_note_counts_the_autograd_kernel_after_the_module(tmp_path, monkeypatch):
    """Under MAX_JOBS=1 the autograd kernel is compiled after the module, not beside it: the
    estimate adds its time and the note names it."""
    import os

    from aiter_aux.jit import progress

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    cost = progress.COMPILE_CPU_S["cpu"]
    after = progress.first_build_note("cpu", tmp_path, 1, autograd_after=tmp_path / "ag")
    total = progress._duration(cost["module"] + cost["autograd"])
    assert f"about {total} on 1 core)" in after, after
    assert f", then the ops' autograd kernel into {tmp_path / 'ag'}" in after, after
