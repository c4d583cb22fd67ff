"""The conformance test of every op of the op table (codegen/ops.py), both forms, on the
compiled CPU backend against the reference; a new op gets all of it by its table entry and
its input builder (op_tests/fuzz_cases.py ``make_case``).

* ``torch.library.opcheck`` (schema, autograd registration, fake tensors, AOT dispatch),
  also with inputs that require grad (the ops are not differentiable: outputs never
  require grad).
* Valid inputs (M = 0 included; ids -1, >= num_experts and huge; every bf16 / float32 bit
  pattern; garbage sort outputs fed to moe_sort_scales; padded ``out=`` buffers): the ``_out``
  form writes exactly the reference's bytes into poisoned buffers with guard regions (also
  what it must leave untouched), the allocating form returns the reference's defined bytes.
* Invalid inputs (wrong dtype, not a tensor, rank, non-contiguous, sparse, another device,
  sizes, model_dim not a multiple of 32, bad ints, buffers too small, row indices out of
  range): the op and the reference raise the same TypeError/ValueError naming the argument,
  no kernel runs and no ``out=`` byte changes; the C++ binding itself (``torch.ops.aiter_aux``,
  no Python wrapper) raises the same type with the same text wherever torch's argument
  parser lets the call reach it.
* All-``meta`` inputs run the fake implementations, whose output shapes and dtypes are the
  real op's; parameters the catalog lacks are built on demand and match the reference, and
  rejected before any kernel runs under ``AITER_AUX_DISABLE_JIT=1``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from fuzz_cases import (  # noqa: E402 (op_tests/fuzz_cases.py)
    alloc_outs,
    corruptions,
    defined,
    guards_ok,
    make_case,
    outside_catalog,
    raw,
    slots,
    untouched,
)  # fmt: skip
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aiter_aux import ops  # noqa: E402
from aiter_aux import reference as ref  # noqa: E402
from aiter_aux.jit.paths import codegen_module  # noqa: E402
from aiter_aux.validation import _checks as C  # noqa: E402

TABLE = codegen_module("ops").OPS
CHECKS = codegen_module("checks")
OPS = tuple(TABLE)  # every op of the op table
FLOATS = {a.name for spec in TABLE.values() for a in spec.args() if type(a).__name__ == "Float"}


def fn(module, name: str):
    """``module``'s function for the torch op ``name`` (``<op>`` or ``<op>_out``): the
    table's Python name, with its selecting argument where it has one (``moe_sort_quant_fp8``
    is ``moe_sort_quant(..., quant_dtype="mxfp8")``)."""
    base = name.removesuffix("_out")
    spec, sfx = TABLE[base], name[len(base) :]
    f = getattr(module, spec.py_name + sfx)
    if spec.python_select:
        arg, value = spec.python_select
        return lambda *a, **kw: f(*a, **kw, **{arg: value})
    return f


FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


class KernelSpy:
    """Counts the calls into the compiled module's instances (the binding's counter,
    ``aiter_aux_kernel_calls``)."""

    def __init__(self, module):
        self.module = module

    @property
    def calls(self) -> int:
        return self.module.kernel_calls()


@pytest.mark.parametrize("op", OPS)
@FUZZ
@given(d=st.data())
def test_valid_inputs_match_reference_bytes(op, d):
    a, outs = make_case(op, d)
    slack = d.draw(st.integers(0, 2), "slack")
    mine, my_wholes = alloc_outs(outs, slack)
    theirs, their_wholes = alloc_outs(outs, slack)
    zb = a.get("zero_buf")
    mine_in = dict(a, zero_buf=zb.clone()) if zb is not None else a
    fn(ops, op + "_out")(**mine_in, **mine)
    fn(ref, op + "_out")(**a, **theirs)
    for got, want in zip(my_wholes, their_wholes, strict=True):  # written and untouched bytes
        assert guards_ok(got), "a write outside an out= buffer"
        assert raw(got) == raw(want)
    if zb is not None:
        assert raw(mine_in["zero_buf"]) == raw(torch.zeros_like(zb))
    bm = a.get("block_m", 32)
    assert defined(op, fn(ops, op)(**a), bm) == defined(op, fn(ref, op)(**a), bm)


@pytest.fixture
def spy(cpu_module):
    return KernelSpy(cpu_module)


@pytest.mark.parametrize("op", OPS)
@settings(FUZZ, max_examples=40)
@given(d=st.data())
def test_invalid_inputs_raise_naming_argument_before_any_kernel(op, d, spy):
    a, outs = make_case(op, d, m_min=2)
    variant = d.draw(st.sampled_from(["", "_out"]), "variant")
    kw, wholes = alloc_outs(outs, 0) if variant else ({}, [])
    label, changes, exc, names = d.draw(st.sampled_from(corruptions(op, a, kw)), "corruption")
    call = {**a, **kw, **changes}
    calls = spy.calls
    with pytest.raises(exc) as mine:
        fn(ops, op + variant)(**call)
    assert spy.calls == calls, f"{label}: a kernel ran"
    assert untouched(wholes), f"{label}: an out= buffer was written"
    assert any(n in str(mine.value) for n in names), f"{label}: {mine.value} names none of {names}"
    with pytest.raises(exc) as theirs:
        fn(ref, op + variant)(**call)
    want = str(theirs.value)
    if CHECKS.has_wide_ids(TABLE[op]) and label in {f"{n}:dtype" for n in CHECKS.WIDE_IDS}:
        # the wrappers take int64 ids too and say so (the reference and the binding: int32)
        want = want.replace("dtype torch.int32,", "dtype torch.int32 or torch.int64,")
    assert str(mine.value) == want
    if not _python_level(changes):  # the binding itself, without the Python wrapper
        with pytest.raises((RuntimeError, exc)) as binding:
            getattr(torch.ops.aiter_aux, op + variant)(**_schema_kwargs(call, op))
        got = (type(binding.value), str(binding.value))  # C++, or the fake for a meta tensor
        assert got in {(RuntimeError, f"{exc.__name__}: {theirs.value}"),
                       (exc, str(theirs.value))}, label  # fmt: skip
        assert spy.calls == calls and untouched(wholes)


def _python_level(changes: dict) -> bool:
    """True when a corruption is of the Python type (a list for a tensor, a bool, float or
    str for an int, five buffers for six): torch's argument parser rejects or converts it
    before the binding sees it, and only the wrapper can name it as the reference does."""
    if any(name in FLOATS for name in changes):  # torch turns a 0-dim tensor into a float
        return True
    values = [x for v in changes.values()
              for x in (v if isinstance(v, ref.MoeSortOutput) else (v,))]  # fmt: skip
    return any(isinstance(v, bool) or not isinstance(v, torch.Tensor | int) for v in values)


def _schema_kwargs(call: dict, op: str) -> dict:
    """A wrapper call's arguments as the torch op's keywords (``out`` of a sort expanded, the
    ``Code`` options as their int codes)."""
    kw = dict(call)
    codes = [a.name for a in TABLE[op].options if type(a).__name__ == "Code"]
    if codes:
        values = getattr(C, f"{op}_codes")(**{n: kw[n] for n in codes if n in kw})
        kw.update(zip(codes, values, strict=True))
    out = kw.get("out")
    if isinstance(out, ref.MoeSortOutput):
        del kw["out"]
        kw.update(out._asdict())
    return kw


@pytest.mark.parametrize("op", OPS)
@settings(FUZZ, max_examples=10)
@given(d=st.data())
def test_meta_tensors_run_the_fake_implementation(op, d, spy):
    a, outs = make_case(op, d)
    variant = d.draw(st.sampled_from(["", "_out"]), "variant")
    kw = alloc_outs(outs, 0)[0] if variant else {}
    call = {**a, **kw}
    for _name, t, put in list(slots(call)):
        call.update(put(t.to("meta")))
    calls = spy.calls
    got = fn(ops, op + variant)(**call)
    assert spy.calls == calls
    if not variant:  # the fake's shapes and dtypes are the real op's
        want = fn(ops, op)(**a)
        flat = lambda r: [t for x in (r if isinstance(r, tuple) else (r,))  # noqa: E731
                          for t in (x if isinstance(x, tuple) else (x,))]  # fmt: skip
        assert [(t.device.type, t.shape, t.dtype) for t in flat(got)] == [
            ("meta", t.shape, t.dtype) for t in flat(want)
        ]


PARAMETRIZED = [op for op in OPS if TABLE[op].params]  # moe_sum: one instance serves all


@pytest.mark.parametrize("op", PARAMETRIZED)
@settings(FUZZ, max_examples=2)
@given(d=st.data())
def test_parameters_outside_catalog_built_on_demand_match_reference(op, d):
    """An instance the loaded module lacks is built on demand; its ``_out`` form then writes
    the reference's bytes into poisoned, guarded buffers."""
    a, outs = make_case(op, d, shape=outside_catalog(op, d))
    mine, my_wholes = alloc_outs(outs, 0)
    theirs, their_wholes = alloc_outs(outs, 0)
    fn(ops, op + "_out")(**a, **mine)
    fn(ref, op + "_out")(**a, **theirs)
    for got, want in zip(my_wholes, their_wholes, strict=True):
        assert guards_ok(got) and raw(got) == raw(want)


@pytest.mark.parametrize("op", PARAMETRIZED)
@settings(FUZZ, max_examples=8)
@given(d=st.data())
def test_parameters_outside_catalog_without_jit_rejected_before_any_kernel(
    op, d, spy, monkeypatch, tmp_path
):
    """``AITER_AUX_DISABLE_JIT=1`` and a cache without an instance the call needs (a composed
    op: any of its parts'): the call raises ``UnsupportedShapeError`` naming the fix, before
    any kernel runs or any byte is written."""
    monkeypatch.setenv("AITER_AUX_DISABLE_JIT", "1")
    monkeypatch.setenv("AITER_AUX_CACHE_DIR", str(tmp_path))
    shape = outside_catalog(op, d)
    params = codegen_module("instances").shape_params(shape)
    keys = codegen_module("instances").call_keys(op, **params)
    # not all built on demand earlier in this process
    hypothesis.assume(not all(spy.module.has(k) for k in keys))
    a, outs = make_case(op, d, shape=shape)
    kw, wholes = alloc_outs(outs, 0)
    calls = spy.calls
    with pytest.raises(ops.UnsupportedShapeError, match="no instance .*DISABLE_JIT"):
        fn(ops, op + "_out")(**a, **kw)
    assert spy.calls == calls and untouched(wholes)


# ------------------------------------------------------------------------------ opcheck
@pytest.mark.parametrize("name", [op + sfx for op in OPS for sfx in ("", "_out")])
@settings(FUZZ, max_examples=1)
@given(d=st.data())
def test_opcheck(name, d):
    op = name.removesuffix("_out")
    a, outs = make_case(op, d, m_min=1)
    kw = alloc_outs(outs, 0)[0] if name.endswith("_out") else {}
    utils = torch.library._OPCHECK_DEFAULT_UTILS
    if TABLE[op].partial_outputs and not name.endswith("_out"):  # rows left uninitialised
        utils = tuple(u for u in utils if not u.startswith("test_aot_dispatch"))
    torch.library.opcheck(getattr(torch.ops.aiter_aux, name).default, (),
                          _schema_kwargs({**a, **kw}, op), test_utils=utils)  # fmt: skip


@pytest.mark.parametrize("op", OPS)
@settings(FUZZ, max_examples=1)
@given(d=st.data())
def test_not_differentiable(op, d):
    """Float inputs that require grad: outputs never require grad (as the reference's), and
    opcheck passes; an ``out=`` buffer that requires grad is refused under grad mode, as
    torch's ``out=`` ops do, before any write."""
    a, outs = make_case(op, d, m_min=1)
    floats = (torch.float32, torch.float16, torch.bfloat16)
    grad = {k: v.clone().requires_grad_() for k, v in a.items()
            if isinstance(v, torch.Tensor) and v.dtype in floats}  # fmt: skip
    call = {**a, **grad}
    result = fn(ops, op)(**call)
    flat = [t for x in (result if isinstance(result, tuple) else (result,))
            for t in (x if isinstance(x, tuple) else (x,))]  # fmt: skip
    assert not any(t.requires_grad for t in flat)
    utils = torch.library._OPCHECK_DEFAULT_UTILS
    if TABLE[op].partial_outputs:
        utils = tuple(u for u in utils if not u.startswith("test_aot_dispatch"))
    torch.library.opcheck(getattr(torch.ops.aiter_aux, op).default, (),
                          _schema_kwargs(call, op), test_utils=utils)  # fmt: skip
    names = [n for n, t, _put in slots(alloc_outs(outs, 0)[0]) if t.dtype in floats]
    for name in names:
        kw, wholes = alloc_outs(outs, 0)  # fresh poisoned buffers for each float buffer's try
        t, put = next((t, put) for n, t, put in slots(kw) if n == name)
        bad = {**kw, **put(t.detach().requires_grad_())}  # a leaf over the guarded bytes
        with pytest.raises(RuntimeError, match="requires grad"):
            fn(ops, op + "_out")(**a, **bad)
        assert untouched(wholes)
        with torch.no_grad():  # torch's rule: allowed without grad mode
            fn(ops, op + "_out")(**a, **bad)


def _written(a: dict, kw: dict) -> list:
    """Every tensor a call writes: the ``out=`` buffers and ``zero_buf`` / ``sorted_scales``."""
    extra = {k: a[k] for k in ("zero_buf", "sorted_scales") if a.get(k) is not None}
    return [t for _name, t, _put in slots({**kw, **extra})]


@pytest.mark.parametrize("op", OPS)
@settings(FUZZ, max_examples=2)
@given(d=st.data())
def test_writes_are_seen_by_autograd(op, d):
    """Every tensor an op writes has its version bumped, through the wrapper and through
    ``torch.ops.aiter_aux`` (what ``torch.library.custom_op`` does for mutated arguments), so
    autograd refuses a backward over overwritten values; under grad mode the torch op refuses
    a written tensor that requires grad, as torch's ``out=`` ops do, before any write."""
    a, outs = make_case(op, d, m_min=1)
    torch_op = getattr(torch.ops.aiter_aux, op + "_out").default
    for call in (fn(ops, op + "_out"), lambda **kw: torch_op(**_schema_kwargs(kw, op))):
        kw, _ = alloc_outs(outs, 0)
        written = _written(a, kw)
        before = [t._version for t in written]
        call(**a, **kw)
        assert all(t._version > v for t, v in zip(written, before, strict=True)), op
    floats = (torch.float32, torch.float16, torch.bfloat16)
    names = [n for n, t, _put in slots(alloc_outs(outs, 0)[0]) if t.dtype in floats]
    for name in names:
        kw, wholes = alloc_outs(outs, 0)  # fresh poisoned buffers for each float buffer's try
        t, put = next((t, put) for n, t, put in slots(kw) if n == name)
        bad = {**kw, **put(t.detach().requires_grad_())}
        with pytest.raises(RuntimeError, match="requires grad"):
            torch_op(**_schema_kwargs({**a, **bad}, op))
        assert untouched(wholes)
        with torch.no_grad():  # allowed without grad mode, as torch's out= ops
            torch_op(**_schema_kwargs({**a, **bad}, op))
