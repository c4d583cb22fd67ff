"""Property/fuzz test (hypothesis) of every public op of the compiled CPU backend
(:mod:`aiter_aux.ops`, catalog instances only) against the reference.

* Valid inputs (M = 0 included; ids -1, >= num_experts and huge; every bf16 / float32 bit
  pattern; garbage sort outputs fed to moe_sort_scales; padded ``out=`` buffers): the ``_out``
  form writes exactly the reference's bytes into poisoned buffers with guard regions (also
  what it must leave untouched), the allocating form returns the reference's defined bytes.
* Invalid inputs (wrong dtype, not a tensor, rank, non-contiguous, another device, sizes,
  model_dim not a multiple of 32, bad ints, buffers too small, row indices out of range): the
  op and the reference raise the same TypeError/ValueError naming the argument, no kernel
  runs and no ``out=`` byte changes; the C++ binding itself (``torch.ops.aiter_aux``, no
  Python wrapper) raises the same type with the same text wherever torch's argument parser
  lets the call reach it.  All-``meta`` inputs run the fake implementations (shapes only);
  parameters the catalog lacks are rejected before any kernel runs.
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

OPS = ("moe_sort", "mxfp4_quant", "moe_sort_quant", "moe_sort_scales", "moe_scatter_reduce",
       "moe_scatter_reduce_q", "mxfp8_quant", "moe_sort_quant_fp8")  # fmt: skip


def fn(module, name: str):
    """``module``'s function for the torch op ``name``: ``moe_sort_quant_fp8[_out]`` is
    ``moe_sort_quant[_out](..., quant_dtype="mxfp8")`` in Python."""
    if name.startswith("moe_sort_quant_fp8"):
        f = getattr(module, name.replace("_fp8", ""))
        return lambda *a, **kw: f(*a, **kw, quant_dtype="mxfp8")
    return getattr(module, name)


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
    assert str(theirs.value) == str(mine.value)
    if not _python_level(changes):  # the binding itself, without the Python wrapper
        with pytest.raises((RuntimeError, exc)) as binding:
            getattr(torch.ops.aiter_aux, op + variant)(**_schema_kwargs(call))
        got = (type(binding.value), str(binding.value))  # C++, or the fake for a meta tensor
        assert got in {(RuntimeError, f"{exc.__name__}: {theirs.value}"),
                       (exc, str(theirs.value))}, label  # fmt: skip
        assert spy.calls == calls and untouched(wholes)


def _python_level(changes: dict) -> bool:
    """True when a corruption is of the Python type (a list for a tensor, a bool, float or
    str for an int, five buffers for six): torch's argument parser rejects or converts it
    before the binding sees it, and only the wrapper can name it as the reference does."""
    values = [x for v in changes.values()
              for x in (v if isinstance(v, ref.MoeSortOutput) else (v,))]  # fmt: skip
    return any(isinstance(v, bool) or not isinstance(v, torch.Tensor | int) for v in values)


def _schema_kwargs(call: dict) -> dict:
    """A wrapper call's arguments as the torch op's keywords (``out`` of a sort expanded)."""
    kw = dict(call)
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


@pytest.mark.parametrize("op", OPS)
@settings(FUZZ, max_examples=8)
@given(d=st.data())
def test_parameters_outside_catalog_rejected_before_any_kernel(op, d, spy):
    a, outs = make_case(op, d, shape=outside_catalog(op, d))
    kw, wholes = alloc_outs(outs, 0)
    calls = spy.calls
    with pytest.raises(ops.UnsupportedShapeError, match="no instance .*add-shape"):
        fn(ops, op + "_out")(**a, **kw)
    assert spy.calls == calls and untouched(wholes)
    fn(ref, op + "_out")(**a, **alloc_outs(outs, 0)[0])  # the spec accepts it
