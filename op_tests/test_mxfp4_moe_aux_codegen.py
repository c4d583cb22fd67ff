"""CPU-only catalog and codegen checks.

Reads the two shape lists with ``ast`` (imports neither torch, aiter_aux nor the
generator's module state) and runs the generator as a subprocess into a temporary
directory.  The keys a shape needs are spelt here from the op table's ``params`` and
``key_parts`` (read by a subprocess), not by the generator's own key function.  Passes in an
environment without torch.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "codegen" / "catalog.py"  # SHAPES, the codegen copy of the catalog
GENERATOR = ROOT / "codegen" / "gen_instances.py"
OPS = ROOT / "aiter_aux" / "ops" / "moe_mxfp4_aux.py"


def _assigned_value(path: Path, name: str) -> ast.expr:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    raise AssertionError(f"{name} is not assigned at module level in {path}")


def _tuples(node: ast.expr) -> list[tuple]:
    """The literal tuples of a list/set literal, or of frozenset({...}) / frozenset([...])."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "frozenset":
        assert len(node.args) == 1, "frozenset(...) must take one literal"
        node = node.args[0]
    assert isinstance(node, ast.List | ast.Set | ast.Tuple), f"not a literal: {ast.dump(node)}"
    return [ast.literal_eval(elt) for elt in node.elts]


def shapes_list() -> list[tuple]:
    return _tuples(_assigned_value(GEN, "SHAPES"))


def supported_list() -> list[tuple]:
    return _tuples(_assigned_value(OPS, "MXFP4_MOE_SUPPORTED_SHAPES"))


def test_catalog_lists_agree():
    shapes, supported = set(shapes_list()), set(supported_list())
    only_gen = sorted(shapes - supported)
    only_ops = sorted(supported - shapes)
    assert not only_gen and not only_ops, (
        f"the two catalogs disagree.\n  in codegen/catalog.py SHAPES only: {only_gen}\n"
        f"  in aiter_aux/ops/moe_mxfp4_aux.py MXFP4_MOE_SUPPORTED_SHAPES only: {only_ops}\n"
        "add each tuple to both lists (aiter-aux add-shape does it)"
    )


@pytest.mark.parametrize("lister", [shapes_list, supported_list], ids=["SHAPES", "SUPPORTED"])
def test_no_duplicates(lister):
    dups = [s for s, n in Counter(lister()).items() if n > 1]
    assert not dups, f"listed more than once: {dups}"


@pytest.mark.parametrize("lister", [shapes_list, supported_list], ids=["SHAPES", "SUPPORTED"])
def test_every_tuple_valid(lister):
    bad = []
    for shape in lister():
        ok = (
            isinstance(shape, tuple)
            and len(shape) == 4
            and all(type(v) is int for v in shape)
            and 1 <= shape[0] <= 1024
            and shape[1] > 0
            and shape[1] % 256 == 0
            and shape[2] > 0
            and shape[2] % 256 == 0
            and 1 <= shape[3] <= min(shape[0], 255)
        )
        if not ok:
            bad.append(shape)
    assert not bad, f"invalid catalog tuples (rules: see codegen/catalog.py): {bad}"


def test_shapes_have_source_comments():
    lines = GEN.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("SHAPES = ["))
    end = next(i for i in range(start, len(lines)) if lines[i] == "]")
    entries = [ln for ln in lines[start + 1 : end] if ln.strip().startswith("(")]
    assert len(entries) == len(shapes_list()), "one shape per line"
    missing = [ln for ln in entries if not re.search(r"\),\s+#\s*\S", ln)]
    assert not missing, f"shapes without a comment naming their source: {missing}"


@cache
def op_table() -> dict[str, tuple[list[str], list[str]]]:
    """``{op: (params, key_parts)}`` of the ops of ``OPS`` in codegen/ops.py with instances
    (a composed op runs its parts' instances), read by a subprocess."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from codegen.ops import OPS; "
            "print(json.dumps({n: [s.params, s.key_parts] for n, s in OPS.items() "
            "if not s.composes}))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return {op: (params, parts) for op, (params, parts) in json.loads(out.stdout).items()}


def _expected_keys(shape) -> set[str]:
    """One key per op: its name, then ``_<letter><value>`` for each of its compile-time
    parameters, which a shape ``(expert, model_dim, inter, topk)`` sets (inter sets none)."""
    e, d, _inter, k = shape
    values = {"num_experts": e, "model_dim": d, "topk": k}
    return {
        op + "".join(f"_{letter}{values[p]}" for p, letter in zip(params, parts, strict=True))
        for op, (params, parts) in op_table().items()
    }


def test_expected_keys_spell_every_parameter():
    """The derivation above on a known shape: one key per op, each naming its parameters."""
    keys = _expected_keys((256, 3072, 256, 8))
    assert len(keys) == len(op_table())
    assert {"moe_sort_e256_k8", "mxfp4_quant_d3072", "moe_scatter_reduce_d3072_k8"} <= keys


def _generate(workdir: Path, backend: str = "cpu") -> str:
    subprocess.run(
        [sys.executable, str(GENERATOR), "--working_path", str(workdir), "--backend", backend],
        check=True,
        capture_output=True,
        text=True,
    )
    return (workdir / "lookup.cpp").read_text()


def _lookup_keys(lookup_text: str) -> list[str]:
    return re.findall(r'^\s*\{"([a-z0-9_]+)", [0-9]+, ', lookup_text, flags=re.M)


def test_every_shape_key_in_generated_lookup(tmp_path):
    keys = _lookup_keys(_generate(tmp_path))
    assert len(keys) == len(set(keys)), "a key appears more than once in the lookup"
    assert keys == sorted(keys), "lookup must be sorted by key (binary search)"
    missing = {s: sorted(_expected_keys(s) - set(keys)) for s in shapes_list()}
    missing = {s: m for s, m in missing.items() if m}
    assert not missing, f"aux keys missing from the generated lookup: {missing}"
    expected_all = set().union(*(_expected_keys(s) for s in shapes_list()))
    assert set(keys) == expected_all, "lookup holds keys no catalog shape needs"
    # one TU per key, every file stamped
    tus = sorted(p.name for p in tmp_path.glob("inst_*.cpp"))
    assert tus == sorted(f"inst_{k}.cpp" for k in keys)
    for p in tmp_path.iterdir():
        assert "do not edit" in p.read_text().splitlines()[0], p


def test_shapes_differing_only_in_inter_share_instances(tmp_path):
    shapes = shapes_list()
    by_inter = Counter((e, d, k) for e, d, _i, k in shapes)
    shared = [key for key, n in by_inter.items() if n > 1]
    assert shared, "the catalog should contain shapes that differ only in inter"
    keys = set(_lookup_keys(_generate(tmp_path)))
    n_expected = len(set().union(*(_expected_keys(s) for s in shapes)))
    assert len(keys) == n_expected < len(op_table()) * len(shapes)


def test_gpu_backend_renders_same_instance_list(tmp_path):
    cpu = _lookup_keys(_generate(tmp_path / "cpu", "cpu"))
    for backend, ext in (("cuda", ".cu"), ("rocm", ".hip")):
        keys = _lookup_keys(_generate(tmp_path / backend, backend))
        assert keys == cpu
        tu = (tmp_path / backend / f"inst_{keys[0]}{ext}").read_text()
        assert '#include "gpu/common.h"' in tu and "stream)" in tu
        assert "torch" not in tu


def test_instance_includes_only_its_ops_header(tmp_path):
    """A GPU instance TU includes its op's kernel header alone (the op table's ``kernels``):
    an edit of another op's kernels does not recompile it.  A CPU instance TU includes no
    kernel header (the ABI header alone: its op's generic kernel is the module's), and the
    module's kernels TUs, one per CPU header, define every op's kernel once."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from codegen.ops import OPS; "
            "print(json.dumps({n: s.kernels for n, s in OPS.items() if s.kernels}))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    kernels = json.loads(out.stdout)
    for backend, ext in (("cpu", ".cpp"), ("cuda", ".cu")):
        out_dir = tmp_path / backend
        for key in _lookup_keys(_generate(out_dir, backend)):
            op = max((o for o in kernels if key == o or key.startswith(o + "_")), key=len)
            tu = (out_dir / f"inst_{key}{ext}").read_text()
            included = [ln for ln in tu.splitlines() if ln.startswith("#include")]
            if backend == "cpu":
                assert included == ['#include "mxfp4_moe_aux_abi.h"'], (key, included)
            else:
                header = f'#include "gpu/{kernels[op][1]}"'
                assert included[-1] == header and len(included) <= 2, (key, included)
    defined = {}
    for tu in (tmp_path / "cpu").glob("kernels_*.cpp"):
        text = tu.read_text()
        included = [ln for ln in text.splitlines() if ln.startswith("#include")]
        assert included == [f'#include "cpu/{tu.stem[len("kernels_"):]}.h"'], (tu, included)
        for op in re.findall(r'extern "C" int aiter_aux_cpu_(\w+)\(', text):
            defined[op] = tu.stem
    assert {op: f"kernels_{k[0][:-2]}" for op, k in kernels.items()} == defined
    assert not list((tmp_path / "cuda").glob("kernels_*"))  # a GPU instance has its kernels


def test_only_the_catalog_independent_binding_includes_torch(tmp_path):
    """Instances and the lookup stay torch-free (fast to compile); the binding is the one TU
    with torch's stable-ABI headers, and it does not change when the catalog does (so adding
    a shape never recompiles it)."""
    _generate(tmp_path / "full")
    for p in (tmp_path / "full").iterdir():
        assert p.name == "binding.cpp" or "torch" not in p.read_text(), p
    binding = (tmp_path / "full" / "binding.cpp").read_text()
    assert "torch/csrc/stable" in binding or "binding/" in binding
    one = tmp_path / "one"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from codegen.gen_instances import generate; "
            f"generate({str(one)!r}, 'cpu', [(256, 3072, 256, 8)])")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    tus = sorted(p.name for p in one.glob("inst_*"))
    assert tus == sorted(f"inst_{k}.cpp" for k in _expected_keys((256, 3072, 256, 8)))
    assert (one / "binding.cpp").read_text() == binding


def test_list_cli_prints_instance_keys(tmp_path):
    out = subprocess.run(
        [sys.executable, str(GENERATOR), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    assert sorted(out) == sorted(_lookup_keys(_generate(tmp_path)))
