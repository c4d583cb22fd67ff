"""The op table (codegen/ops.py) and what is generated from it: the checked-in generated
files are current, a mistake in a table entry is a clear error naming the op, and the limits
are defined once (codegen/limits.py) and agree everywhere they appear."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from aiter_aux.jit.paths import codegen_module

ROOT = Path(__file__).resolve().parents[1]


def test_generated_sources_are_current():
    """aiter_aux/validation/_checks.py, aiter_aux/ops/_ops.py, the limits header and
    docs/api.md are what `python codegen/gen_sources.py` writes from the table."""
    p = subprocess.run([sys.executable, str(ROOT / "codegen" / "gen_sources.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_table_validates():
    codegen_module("validate").validate(codegen_module("ops").OPS)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(op_id=2), "op_id 2 must be a positive int no other op uses (also 'moe_sort')"),
        (dict(key_parts=("e",)), "key_parts ('e',) needs one letter per compile-time"),
        (dict(params=("num_experts", "block_mm")), "'block_mm' is neither an int argument"),
        (dict(fill=("topk_idz",)), "topk_idz is not bound at that point"),
        (dict(checks=(codegen_module("opspec").Limit("M", "num_token"),)),
         "Limit 'num_token' is not one of"),
        (dict(kernels=("core_cpu.h", "")),
         "kernels[1], the GPU header under gpu/ must name an existing"),
        (dict(kernels=("sort_cpu.h", "sort.h")), "kernels[0], the CPU header under cpu/"),
    ],
)  # fmt: skip
def test_a_wrong_entry_names_the_op_and_the_fix(change, message):
    ops = codegen_module("ops")
    spec = ops.OPS["moe_sort"]
    if "params" in change:
        change["key_parts"] = ("e", "b")
    bad = dict(ops.OPS, moe_sort=dataclasses.replace(spec, **change))
    with pytest.raises(codegen_module("validate").OpTableError) as e:
        codegen_module("validate").validate(bad)
    assert "op 'moe_sort'" in str(e.value) or "op 'mxfp4_quant'" in str(e.value)
    assert message in str(e.value)


def test_limits_are_defined_once():
    """The catalog's expert and topk bounds, the Python validators' constants and the
    kernels' header are codegen/limits.py's."""
    limits, catalog = codegen_module("limits"), codegen_module("catalog")
    assert catalog.MAX_EXPERTS == limits.NUM_EXPERTS.hi
    assert catalog.MAX_TOPK == limits.TOPK.hi
    from aiter_aux import validation as V

    assert V.BLOCK_M_VALUES == limits.BLOCK_M.values
    assert V.MAX_NUM_EXPERTS == limits.NUM_EXPERTS.hi and V.MAX_TOPK == limits.TOPK.hi
    assert V.MAX_NUM_TOKENS == limits.NUM_TOKENS.hi and V.MAX_ROWS_LIMIT == limits.MAX_ROWS
    from aiter_aux import limits as L

    assert L.MAX_ALIGN_BLOCK_SIZE == limits.ALIGN_BLOCK_SIZE.hi


# Literal spellings of the token limit and the block_m set in code (comments and strings
# are not code): each must come from codegen/limits.py through the generated constants.
_LITERAL_LIMITS = re.compile(
    r"\b16777216\b|\b1\)?\s*<<\s*24\b|\b2\s*\*\*\s*24\b|\(16,\s*32,\s*64,\s*128\)"
    r"|==\s*16\s*(\|\||or)\s*\w+\s*==\s*32\s*(\|\||or)\s*\w+\s*==\s*64"
)
# The same spelling for another quantity.
_NOT_A_LIMIT = {("csrc/kernels/mxfp4_moe/gpu/sort_policy.h", "1) << 24")}  # a tuning threshold


def _code_of(path: Path) -> str:
    """The code of a hand-written source file without its comments and string literals."""
    text = path.read_text()
    if path.suffix == ".py":
        toks = tokenize.generate_tokens(io.StringIO(text).readline)
        skip = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
        return " ".join(t.string for t in toks if t.type not in skip)
    return re.sub(r'//[^\n]*|"(?:\\.|[^"\\\n])*"', " ", text)


def _hand_written_sources() -> list[Path]:
    files = [p for d in ("aiter_aux", "codegen", "templates") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".j2")]  # fmt: skip
    files += [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cpp", ".cu")]
    return [
        p for p in files
        if p != ROOT / "codegen" / "limits.py" and "do not edit" not in p.read_text()[:300]
    ]  # fmt: skip


def test_no_hand_written_copy_of_a_limit():
    """The token limit 2^24 and the block_m set are written in code only in
    codegen/limits.py; every other place uses aiter_aux/limits.py (Python) or
    aiter_aux_limits.h (C++), both generated from it."""
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in _hand_written_sources() for m in _LITERAL_LIMITS.finditer(_code_of(p))
        if (str(p.relative_to(ROOT)), m.group(0)) not in _NOT_A_LIMIT
    ]  # fmt: skip
    assert found == []


def test_every_macro_of_the_limits_header_is_used():
    """aiter_aux_limits.h defines only what the kernels use."""
    header = ROOT / "csrc/kernels/mxfp4_moe/aiter_aux_limits.h"
    names = re.findall(r"#define (AITER_AUX_\w+)", header.read_text())
    users = [_code_of(p) for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cpp", ".cu")
             and p != header]  # fmt: skip
    assert names and [n for n in names if not any(re.search(rf"\b{n}\b", u) for u in users)] == []


def test_the_python_limits_need_no_torch():
    """aiter_aux/limits.py (what the command-line tool reads) imports nothing."""
    p = subprocess.run([sys.executable, "-c", "import sys, aiter_aux.limits as L; "
                        "assert 'torch' not in sys.modules; print(L.MAX_NUM_TOKENS)"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == str(1 << 24), p.stderr


def test_a_dtype_set_or_copy_must_name_a_known_tensor():
    """``"float"`` (float32/float16/bfloat16) is a dtype of the table; ``"=<tensor>"`` must
    name a required tensor argument (its dtype is copied), else the table does not validate."""
    ops, validate = codegen_module("ops"), codegen_module("validate")
    spec = ops.OPS["moe_sum"]
    assert spec.inputs[0].dtype == "float" and spec.outputs[0].dtype == "=input"
    for bad_dtype in ("=topk_ids", "=nothing", "float64"):
        out = dataclasses.replace(spec.outputs[0], dtype=bad_dtype)
        bad = dict(ops.OPS, moe_sum=dataclasses.replace(spec, outputs=(out,)))
        with pytest.raises(validate.OpTableError, match="op 'moe_sum'"):
            validate.validate(bad)


def test_a_composed_op_runs_its_parts_and_has_no_instances():
    """``composes`` names other plain ops of the table, each on a member of the args struct,
    whose parameters the op has; a composed op has no kernels and no instances (the binding
    launches its parts' instances), so the catalog and compile_check hold none of it."""
    ops, validate = codegen_module("ops"), codegen_module("validate")
    spec = ops.OPS["moe_route_sort_quant"]
    assert spec.composes == (("moe_route", "route"), ("moe_sort_quant", "sort_quant"))
    assert ops.OPS["moe_route_sort_quant_fp8"].composes[1] == ("moe_sort_quant_fp8", "sort_quant")
    bad_tables = [
        dict(composes=(("moe_route", "route"), ("moe_nothing", "x"))),  # no such op
        dict(composes=(("moe_route_sort_quant", "x"),)),  # itself
        dict(composes=(("moe_route_sort_quant_fp8", "x"),)),  # a composed op
        dict(composes=(("moe_route", "route"), ("moe_sort_scales", "x"))),  # model_dim only ...
        dict(composes=("moe_route",)),  # not (op, member)
        dict(kernels=("sort_cpu.h", "sort.h")),  # kernels of its own
    ]
    bad_scales = dataclasses.replace(spec, params=("num_experts", "topk"), key_parts=("e", "k"))
    for i, change in enumerate(bad_tables):
        base = bad_scales if i == 3 else spec
        bad = dict(ops.OPS, moe_route_sort_quant=dataclasses.replace(base, **change))
        with pytest.raises(validate.OpTableError, match="composes|kernels"):
            validate.validate(bad)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import compile_check
    finally:
        sys.path.pop(0)
    inst = codegen_module("instances")
    catalog = inst.enumerate_instances(codegen_module("catalog").SHAPES)
    assert not [i for i in catalog if i.spec.composes]
    chosen = compile_check.representative(catalog)
    assert len([i for i in chosen if i.op == "moe_sort_quant"]) > 1
    # the binding launches the parts on their members, in order
    binding = codegen_module("render").Renderer("cpu").render_binding()
    body = binding[binding.index("moe_route_sort_quant_out(") :]
    body = body[: body.index("\n}\n")]
    assert body.index("find_instance(13,") < body.index("find_instance(3,")
    assert "launch(inst0, &args.route," in body and "launch(inst1, &args.sort_quant," in body


def test_each_op_is_registered_where_its_entry_says():
    """The aggregators include each op's kernel header and the reference package exports its
    functions from the module its entry names (both generated from the table)."""
    import aiter_aux.reference as ref

    ops, registry = codegen_module("ops"), codegen_module("registry")
    cpu = (ROOT / registry.CPU_AGGREGATOR).read_text()
    gpu = (ROOT / registry.GPU_AGGREGATOR).read_text()
    for spec in ops.OPS.values():
        if spec.composes:  # no kernels of its own
            assert not spec.kernels, spec.name
            continue
        header_cpu, header_gpu = spec.kernels
        assert f'#include "{header_gpu}"' in gpu, spec.name
        assert not header_cpu or f'#include "{header_cpu}"' in cpu, spec.name
        module = getattr(ref, spec.reference)
        for fn in (spec.py_name, spec.py_name + "_out"):
            assert fn in module.__all__ and getattr(ref, fn) is getattr(module, fn), fn


def test_a_reference_module_that_does_not_exist_is_named():
    ops, registry = codegen_module("ops"), codegen_module("registry")
    bad = dict(ops.OPS, moe_sort=dataclasses.replace(ops.OPS["moe_sort"], reference="sorts"))
    with pytest.raises(SystemExit, match="op 'moe_sort': reference must name a module .*'sorts'"):
        registry.render_reference_table(bad)


def test_a_shape_builds_no_instance_its_op_refuses():
    """A rule of an op over its compile-time parameters alone keeps that op's instance out of
    a shape's set: SGLang's align serves num_experts <= 1023, so E = 1024 builds every other
    op's instance but not that one."""
    inst = codegen_module("instances")

    def keys(e: int) -> set[str]:
        return {i.key for i in inst.instances_for_shape((e, 4096, 512, 8))}

    renamed = {k.replace("_e1024", "_e1023") for k in keys(1024)}
    assert keys(1023) - renamed == {"moe_align_block_size_sglang_e1023"}
    assert renamed < keys(1023)
