"""The torch binding of the module (csrc/kernels/mxfp4_moe/binding/, templates/binding.j2):
the op table is the one definition of every op, overlapping buffers are refused
by the reference and by the binding alike, and the GPU variant of the binding compiles
here against the installed torch's headers."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.jit.module import ABI_VERSION  # noqa: E402
from aiter_aux.jit.paths import codegen_module, kernels_dir  # noqa: E402
from aiter_aux.ops import _ops  # noqa: E402

E, D, K, BM = 257, 7168, 9, 32  # a catalog shape (DeepSeek-R1)


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def test_abi_version_is_the_headers():
    header = (kernels_dir() / "mxfp4_moe_aux_abi.h").read_text()
    assert int(re.search(r"#define AITER_AUX_ABI_VERSION (\d+)", header).group(1)) == (ABI_VERSION)


def test_torch_schemas_are_the_op_tables():
    """Every op of the op table, both forms, is defined with the table's schema (the
    generated SCHEMAS of aiter_aux/ops/_ops.py are the table's)."""
    table, opspec = codegen_module("ops"), codegen_module("opspec")
    want = {}
    for spec in table.OPS.values():
        for schema in opspec.schemas(spec):
            want[schema.split("(")[0]] = schema
    assert _ops.SCHEMAS == want
    for name, schema in want.items():
        got = str(getattr(torch.ops.aiter_aux, name).default._schema)
        assert got == str(torch._C.parse_schema(f"aiter_aux::{schema}"))
    assert set(_ops.FAKES) == set(want)


def test_cpp_signatures_follow_the_schemas():
    table, opspec = codegen_module("ops"), codegen_module("opspec")
    _alloc, out = opspec.schemas(table.OPS["moe_sort"])
    assert opspec.cpp_signature(out) == (
        "void(const Tensor&, const Tensor&, int64_t, int64_t, " + "const Tensor&, " * 6
        + ", ".join(["const std::optional<Tensor>&"] * 3) + ")"
    )  # fmt: skip
    # the fused ops take a fourth optional tensor, sorted_scales
    for op in ("moe_sort_quant", "moe_sort_quant_fp8"):
        alloc, out = opspec.schemas(table.OPS[op])
        assert out.endswith("Tensor(s!)? sorted_scales=None) -> ()")
        assert opspec.cpp_signature(out) == (
            "void(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, "
            + "const Tensor&, " * 8
            + ", ".join(["const std::optional<Tensor>&"] * 4)
            + ")"
        )
        assert opspec.cpp_signature(alloc) == (
            f"std::tuple<{', '.join(['Tensor'] * 8)}>(const Tensor&, const Tensor&, "
            "const Tensor&, int64_t, int64_t, " + ", ".join(["const std::optional<Tensor>&"] * 4)
            + ")"
        )  # fmt: skip
    assert "sorted_scales" not in opspec.schemas(table.OPS["moe_sort"])[0]


def _sort_case(m=4):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, E, (m, K), generator=g, dtype=torch.int32)
    w = torch.rand(m, K, generator=g)
    x = torch.randn(m, D, generator=g).to(torch.bfloat16)
    return ids, w, x


def _aliased_calls():
    """The five aliasing cases, each as (label, op name, kwargs)."""
    ids, w, x = _sort_case()
    m = ids.shape[0]
    rows = ref.moe_sort_capacity(m, K, E, BM)
    sort = ref.MoeSortOutput(*(torch.empty(n, dtype=dt) for n, dt in (
        (rows, torch.int32), (rows, torch.float32), (rows, torch.int32),
        (rows // BM, torch.int32), (2, torch.int32), (m * K, torch.int32))))  # fmt: skip
    q = torch.empty(m, D // 2, dtype=torch.uint8)
    s = torch.empty(m, D // 32, dtype=torch.uint8)
    shared = sort._replace(m_indices=sort.sorted_token_ids)
    a_q_over_x = x.view(-1).view(torch.uint8)[: m * D // 2].view(m, D // 2)
    s_in_q = q.view(-1)[: m * D // 32].view(m, D // 32)
    s_ref = ref.moe_sort(ids, w, E, BM)
    eo = torch.randn(s_ref.sorted_token_ids.numel(), D).to(torch.bfloat16)
    return [
        ("m_indices is sorted_token_ids", "moe_sort_out",
         dict(topk_ids=ids, topk_weights=w, num_experts=E, block_m=BM, out=shared)),
        ("a_scale is a view of a_q", "mxfp4_quant_out", dict(x=x, a_q=q, a_scale=s_in_q)),
        ("a_q is a view of x", "mxfp4_quant_out", dict(x=x, a_q=a_q_over_x, a_scale=s)),
        ("zero_buf=x in the fused op", "moe_sort_quant",
         dict(topk_ids=ids, topk_weights=w, x=x, num_experts=E, block_m=BM, zero_buf=x)),
        ("scatter out=expert_out[:M]", "moe_scatter_reduce_out",
         dict(expert_out=eo, reverse_sorted=s_ref.reverse_sorted,
              sorted_weights=s_ref.sorted_weights, topk=K, out=eo[:m])),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _aliased_calls()])
def test_overlapping_buffers_are_refused_before_any_kernel(case, cpu_module):
    label, op, kw = _aliased_calls()[case]
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    calls = cpu_module.kernel_calls()
    with pytest.raises(ValueError, match="overlaps .* in memory") as mine:
        getattr(ops, op)(**kw)
    assert cpu_module.kernel_calls() == calls, f"{label}: a kernel ran"
    for k, v in before.items():
        assert torch.equal(kw[k].view(torch.uint8), v.view(torch.uint8)), f"{label}: {k} written"
    with pytest.raises(ValueError) as theirs:
        getattr(ref, op)(**kw)
    assert str(theirs.value) == str(mine.value)


def test_disjoint_views_of_one_buffer_are_fine():
    """Outputs may live in one allocation as long as their bytes do not overlap."""
    _ids, _w, x = _sort_case()
    m = x.shape[0]
    buf = torch.empty(m * D // 2 + m * D // 32, dtype=torch.uint8)
    q = buf[: m * D // 2].view(m, D // 2)
    s = buf[m * D // 2 :].view(m, D // 32)
    ops.mxfp4_quant_out(x, q, s)
    want_q, want_s = ref.mxfp4_quant(x)
    assert torch.equal(q, want_q) and torch.equal(s, want_s)


@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_gpu_binding_compiles_against_installed_torch(backend, tmp_path):
    """The GPU variant of the binding TU (USE_CUDA shim calls, device guard, stream) compiles
    with the host compiler against this torch's headers (syntax only; no GPU needed)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    gen = codegen_module("render").Renderer(backend)
    src = tmp_path / "binding.cpp"
    src.write_text(gen.render_binding())
    from aiter_aux.jit.toolchain import TORCH_TARGET, _torch_build

    _version, root = _torch_build()
    major, minor = TORCH_TARGET
    cmd = [cxx, "-std=c++17", "-fsyntax-only", f"-I{kernels_dir()}", f"-I{root / 'include'}",
           f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000ULL", str(src)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def test_module_shares_no_symbol_with_another_module(cpu_module):
    """A process may load a CPU and a CUDA module: no object of one binding may be unified with
    the other's (STB_GNU_UNIQUE: static locals of inline functions).  Seen on the H200: the
    CUDA binding took a CPU kernel from find_instance's shared cache and crashed.  (The
    kernels' unique symbols live in per-backend namespaces, aiter_aux::cpu / aiter_aux::gpu,
    and are constant tables.)"""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("binutils missing")
    out = subprocess.run([nm, "-DC", "--defined-only", str(cpu_module.path)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    unique = [ln for ln in out.splitlines() if " u " in ln and "aiter_aux::binding" in ln]
    assert not unique, unique


def _static_exports(path, seen=()) -> set[str]:
    """The names a type checker sees in the package module ``path``: its top-level and
    ``if TYPE_CHECKING:`` imports, a star import resolved through the target's literal
    ``__all__`` (a computed ``__all__`` exports nothing to a type checker)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = Path(path).parent.joinpath(
            *([".."] * (node.level - 1)), *(node.module or "").split(".")
        )
        target = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        for alias in node.names:
            if alias.name != "*":
                names.add(alias.asname or alias.name)
                continue
            literal = [n for n in ast.parse(target.read_text()).body if isinstance(n, ast.Assign)
                       and any(getattr(t, "id", None) == "__all__" for t in n.targets)]  # fmt: skip
            for assign in literal:
                if isinstance(assign.value, ast.List):
                    names |= {e.value for e in assign.value.elts if isinstance(e, ast.Constant)}
    return names


def test_the_top_level_api_is_typed_for_type_checkers():
    """``aiter_aux.<op>`` (the README's spelling) resolves to the typed wrapper for a type
    checker, not to the module ``__getattr__``'s Any: every public name is imported under
    ``if TYPE_CHECKING:`` in aiter_aux/__init__.py; ``from aiter_aux import *`` gives the
    same names."""
    import aiter_aux
    import aiter_aux.ops

    public = {*aiter_aux.ops.__all__, *aiter_aux._PREDICATES}
    missing = public - _static_exports(aiter_aux.__file__)
    assert not missing, sorted(missing)
    scope: dict = {}
    exec("from aiter_aux import *", scope)
    assert public <= set(scope) and "importlib" not in scope


def test_public_api_is_annotated():
    """Every public function (ops, reference, predicates) annotates each parameter and its
    return type; the package ships py.typed."""
    import importlib
    import inspect
    from pathlib import Path

    import aiter_aux

    assert (Path(aiter_aux.__file__).parent / "py.typed").is_file()
    modules = ["aiter_aux.ops._ops", "aiter_aux.reference", "aiter_aux.ops.moe_mxfp4_aux"]
    missing = []
    for name in modules:
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if n.startswith("is_")]
        for attr in names:
            fn = getattr(mod, attr)
            if not inspect.isfunction(fn):
                continue
            sig = inspect.signature(fn)
            if sig.return_annotation is inspect.Signature.empty:
                missing.append(f"{name}.{attr} -> ?")
            missing += [f"{name}.{attr}({p})" for p, v in sig.parameters.items()
                        if v.annotation is inspect.Parameter.empty]  # fmt: skip
    assert not missing, missing
