"""The ``aiter_aux`` torch ops: schemas, fake implementations and the lazy loader.

:func:`define` (run when :mod:`aiter_aux.ops` is imported) defines, for every op of the op
table (``codegen/instances.py`` ``OPS``), ``torch.ops.aiter_aux.<op>`` (allocating) and
``torch.ops.aiter_aux.<op>_out`` (mutates its buffers, returns nothing) with the schemas
:func:`schemas` generates, plus:

* a fake (meta) implementation of each, which checks shapes and dtypes with the reference's
  checks (:mod:`aiter_aux.validation`) when sizes are static and computes output shapes
  from sizes alone, so bad input fails while tracing too;
* a ``CompositeExplicitAutograd`` kernel, the *loader*: the first call on a backend loads
  (building if needed) that backend's module, whose C++ binding registers the real CPU or
  CUDA kernels (torch's stable ABI, csrc/kernels/mxfp4_moe/binding/).  A kernel registered
  for a backend key takes precedence over this alias key, so every later call goes straight
  to C++.  The loader dispatches once more after the load (its own or a concurrent one).
"""

from __future__ import annotations

import threading

import torch

from .. import validation as V
from ..jit.paths import codegen_module

T = torch.Tensor
_LOCK = threading.Lock()
_LIB: torch.library.Library | None = None
_LOADED_BACKENDS: set[str] = set()


def backend_of(device: torch.device) -> str:
    """The module backend serving tensors on ``device``; ValueError for other devices."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    raise ValueError(f"the tensors are on {device}: the compiled ops take cpu or cuda tensors only")


_REDISPATCH = threading.local()  # .active: this thread is re-dispatching from the loader


def _loader(name: str):
    """The kernel that loads the backend's module on the first call, then dispatches again.
    Concurrent first calls wait on the lock for the one load and all dispatch again (the
    module's kernels take over); only a dispatch that lands here again, with the module
    loaded, raises."""

    def kernel(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        cuda = [t for t in tensors if t.device.type == "cuda"]
        backend = backend_of((cuda or tensors)[0].device)
        if getattr(_REDISPATCH, "active", False):
            devices = sorted({str(t.device) for t in tensors})
            raise RuntimeError(
                f"aiter_aux::{name}: the {backend} module is loaded but registered no "
                f"kernel for these tensors' devices ({devices})"
            )
        if backend not in _LOADED_BACKENDS:
            with _LOCK:
                if backend not in _LOADED_BACKENDS:  # else another thread loaded it meanwhile
                    from ..jit.spec import load_module

                    load_module(backend)  # its binding registers the backend's kernels
                    _LOADED_BACKENDS.add(backend)
        _REDISPATCH.active = True
        try:
            return getattr(torch.ops.aiter_aux, name).default(*args, **kwargs)
        finally:
            _REDISPATCH.active = False

    kernel.__name__ = f"load_then_{name}"
    return kernel


# ------------------------------------------------------------------ fake implementations
def _static(*tensors: T | None) -> bool:
    """True when every size is a plain int (not a SymInt of a dynamic-shape trace)."""
    return all(isinstance(s, int) for t in tensors if t is not None for s in t.shape)


def _sort_shapes(ids: T, w: T, num_experts: int, block_m: int, zero_buf, x=None, opts=(None, None),
                 sorted_scales=None):  # fmt: skip
    """(M, topk, max_rows) with the reference's checks when sizes are static; ``opts`` is
    (expert_map, zero_buf_init); ``sorted_scales`` only with ``x`` (the fused ops)."""
    if _static(ids, w, zero_buf, x, *opts, sorted_scales):
        if x is None:
            return V.validate_moe_sort(ids, w, num_experts, block_m, zero_buf, *opts)
        return V.check_moe_sort_quant_alloc_call(
            ids, w, x, num_experts, block_m, zero_buf, *opts, sorted_scales
        )[:3]
    V.check_tensor(ids, "topk_ids", torch.int32, 2, "[M, topk]")
    V.check_tensor(w, "topk_weights", torch.float32, 2, "[M, topk]")
    m, k = ids.shape
    b = V.validate_block_m(block_m)
    return m, k, (m * k + V.validate_num_experts(num_experts) * (b - 1) + b - 1) // b * b


def _fake_sort(topk_ids, topk_weights, num_experts, block_m, *, zero_buf=None, expert_map=None,
               zero_buf_init=None):  # fmt: skip
    m, k, max_rows = _sort_shapes(
        topk_ids, topk_weights, num_experts, block_m, zero_buf, None, (expert_map, zero_buf_init)
    )
    i32 = topk_ids.new_empty
    return (i32(max_rows), topk_weights.new_empty(max_rows), i32(max_rows),
            i32(max_rows // block_m), i32(2), i32(m * k))  # fmt: skip


def _fake_quant(x, fp8=False):
    if _static(x):
        V.validate_mxfp4_quant(x)
    else:
        V.check_tensor(x, "x", torch.bfloat16, 2, "[M, model_dim]")
    m, d = x.shape
    cq = d if fp8 else d // 2
    return x.new_empty(m, cq, dtype=torch.uint8), x.new_empty(m, d // 32, dtype=torch.uint8)


def _fake_quant_fp8(x):
    return _fake_quant(x, fp8=True)


def _fake_sort_quant(topk_ids, topk_weights, x, num_experts, block_m, *, zero_buf=None,
                     expert_map=None, zero_buf_init=None, sorted_scales=None,
                     fp8=False):  # fmt: skip
    _sort_shapes(
        topk_ids, topk_weights, num_experts, block_m, zero_buf, x, (expert_map, zero_buf_init),
        sorted_scales,
    )  # fmt: skip
    return (*_fake_sort(topk_ids, topk_weights, num_experts, block_m), *_fake_quant(x, fp8))


def _fake_sort_quant_fp8(*args, **kwargs):
    return _fake_sort_quant(*args, **kwargs, fp8=True)


def _fake_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m):
    if _static(a_scale, sorted_token_ids, num_valid_ids):
        V.validate_moe_sort_scales(a_scale, sorted_token_ids, num_valid_ids, block_m)
    out_rows = V.sort_scales_rows(sorted_token_ids.shape[0], V.validate_block_m(block_m))
    return a_scale.new_empty(out_rows, a_scale.shape[1])


def _fake_scatter(expert_out, reverse_sorted, sorted_weights, topk, *, routed_scaling_factor=1.0):
    if _static(expert_out, reverse_sorted, sorted_weights):
        V.validate_moe_scatter_reduce(expert_out, reverse_sorted, sorted_weights, topk)
    m = reverse_sorted.shape[0] // V.validate_topk(topk)
    return expert_out.new_empty(m, expert_out.shape[1])


def _fake_scatter_q(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, *,
                    routed_scaling_factor=1.0):  # fmt: skip
    if _static(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights):
        V.validate_moe_scatter_reduce_q(
            expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk
        )
    m = reverse_sorted.shape[0] // V.validate_topk(topk)
    return expert_out_q.new_empty(m, expert_out_scale.shape[1] * 32, dtype=torch.bfloat16)


# The _out fakes: the reference's checks of inputs, buffers and overlap (static sizes only:
# a symbolic size would turn every check into a guard), then nothing to compute.
def _fake_sort_out(topk_ids, topk_weights, num_experts, block_m, *outs, zero_buf=None,
                   expert_map=None, zero_buf_init=None):  # fmt: skip
    if _static(topk_ids, topk_weights, zero_buf, expert_map, zero_buf_init, *outs):
        V.check_moe_sort_call(topk_ids, topk_weights, num_experts, block_m, outs, zero_buf,
                              expert_map, zero_buf_init)  # fmt: skip


def _fake_quant_out(x, a_q, a_scale, fp8=False):
    if _static(x, a_q, a_scale):
        V.check_mxfp4_quant_call(x, a_q, a_scale, fp8)


def _fake_quant_fp8_out(x, a_q, a_scale):
    _fake_quant_out(x, a_q, a_scale, fp8=True)


def _fake_sort_quant_out(topk_ids, topk_weights, x, num_experts, block_m, *outs, zero_buf=None,
                         expert_map=None, zero_buf_init=None, sorted_scales=None,
                         fp8=False):  # fmt: skip
    if _static(topk_ids, topk_weights, x, zero_buf, expert_map, zero_buf_init, sorted_scales,
               *outs):  # fmt: skip
        V.check_moe_sort_quant_call(
            topk_ids, topk_weights, x, num_experts, block_m, outs[:6], outs[6], outs[7], zero_buf,
            expert_map, zero_buf_init, fp8, sorted_scales,
        )  # fmt: skip


def _fake_sort_quant_fp8_out(*args, **kwargs):
    _fake_sort_quant_out(*args, **kwargs, fp8=True)


def _fake_sort_scales_out(a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales):
    if _static(a_scale, sorted_token_ids, num_valid_ids, sorted_scales):
        V.check_moe_sort_scales_call(
            a_scale, sorted_token_ids, num_valid_ids, block_m, sorted_scales
        )


def _fake_scatter_out(expert_out, reverse_sorted, sorted_weights, topk, out, *,
                      routed_scaling_factor=1.0):  # fmt: skip
    if _static(expert_out, reverse_sorted, sorted_weights, out):
        V.check_moe_scatter_reduce_call(expert_out, reverse_sorted, sorted_weights, topk, out,
                                        routed_scaling_factor)  # fmt: skip


def _fake_scatter_q_out(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out,
                        *, routed_scaling_factor=1.0):  # fmt: skip
    if _static(expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, out):
        V.check_moe_scatter_reduce_q_call(
            expert_out_q, expert_out_scale, reverse_sorted, sorted_weights, topk, out,
            routed_scaling_factor,
        )  # fmt: skip


FAKES = {
    "moe_sort": _fake_sort,
    "moe_sort_out": _fake_sort_out,
    "mxfp4_quant": _fake_quant,
    "mxfp4_quant_out": _fake_quant_out,
    "moe_sort_quant": _fake_sort_quant,
    "moe_sort_quant_out": _fake_sort_quant_out,
    "mxfp8_quant": _fake_quant_fp8,
    "mxfp8_quant_out": _fake_quant_fp8_out,
    "moe_sort_quant_fp8": _fake_sort_quant_fp8,
    "moe_sort_quant_fp8_out": _fake_sort_quant_fp8_out,
    "moe_sort_scales": _fake_sort_scales,
    "moe_sort_scales_out": _fake_sort_scales_out,
    "moe_scatter_reduce": _fake_scatter,
    "moe_scatter_reduce_out": _fake_scatter_out,
    "moe_scatter_reduce_q": _fake_scatter_q,
    "moe_scatter_reduce_q_out": _fake_scatter_q_out,
}


def op_schemas() -> dict[str, str]:
    """``{op name: schema}`` of both forms of every op of the op table."""
    inst = codegen_module("instances")
    return {s.split("(")[0]: s for spec in inst.OPS.values() for s in inst.schemas(spec)}


def define() -> torch.library.Library:
    """Define the ``aiter_aux`` ops (once per process) and return their library."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                lib = torch.library.Library("aiter_aux", "DEF")
                schemas = op_schemas()
                if set(schemas) != set(FAKES):
                    raise RuntimeError(
                        f"op table and fake implementations disagree: {sorted(schemas)} vs "
                        f"{sorted(FAKES)}"
                    )
                for name, schema in schemas.items():
                    lib.define(schema)
                    lib.impl(name, _loader(name), "CompositeExplicitAutograd")
                    torch.library.register_fake(f"aiter_aux::{name}", FAKES[name], lib=lib)
                _LIB = lib
    return _LIB
