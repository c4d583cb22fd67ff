"""The supported-shape catalog of the specialised MXFP4 MoE aux path, and the predicates a
dispatcher asks before taking it.

``MXFP4_MOE_SUPPORTED_SHAPES`` must equal ``SHAPES`` in ``codegen/catalog.py`` (the AST
test ``op_tests/test_mxfp4_moe_aux_codegen.py`` checks it).  Each tuple is
``(expert, model_dim, inter_rounded, topk)``: ``expert`` counts a fused shared expert where it
is odd, ``topk`` then counts it too, and ``inter_rounded`` is inter_dim rounded up to a
multiple of 256.  To add a shape: ``aiter-aux add-shape E,MODEL_DIM,INTER,TOPK``.

The ops themselves are :mod:`aiter_aux.ops` (also importable from here, and from
:mod:`aiter_aux`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..shapes import round_inter

# (expert, model_dim, inter_rounded, topk)
MXFP4_MOE_SUPPORTED_SHAPES = frozenset(
    {
        (385, 7168, 512, 9),  # Kimi-K2.5 TP4
        (385, 7168, 1024, 9),  # Kimi-K2.5 TP2
        (385, 7168, 256, 9),  # Kimi-K2.5 TP8
        (385, 7168, 2048, 9),  # Kimi-K2 TP1, shared expert fused (moe_inter 2048)
        (384, 7168, 512, 8),  # Kimi-K2 TP4
        (384, 7168, 256, 8),  # Kimi-K2 TP8 (moe_inter 2048 / 8)
        (384, 7168, 2048, 8),  # Kimi-K2 TP1, shared expert not fused (moe_inter 2048)
        (257, 7168, 512, 9),  # DeepSeek-R1 TP4
        (257, 7168, 256, 9),  # DeepSeek-R1 TP8
        (257, 7168, 2048, 9),  # DeepSeek-V3 TP1, shared expert fused (moe_inter 2048)
        (257, 7168, 1024, 9),  # DeepSeek-V3 TP2, shared expert fused (moe_inter 2048 / 2)
        (256, 7168, 512, 8),  # DeepSeek-V3/R1 TP4, shared expert not fused (moe_inter 2048 / 4)
        (256, 7168, 256, 8),  # DeepSeek-V3/R1 TP8, shared expert not fused (moe_inter 2048 / 8)
        (256, 7168, 2048, 8),  # DeepSeek-V3 TP1, shared expert not fused (moe_inter 2048)
        (256, 7168, 1024, 8),  # DeepSeek-V3 TP2, shared expert not fused (moe_inter 2048 / 2)
        (32, 7168, 2048, 8),  # DeepSeek-V3/R1 EP8 (256 / 8 local experts)
        (33, 7168, 2048, 8),  # no public model (DeepSeek-V3/R1 EP8 plus one expert, topk 8)
        (64, 7168, 2048, 8),  # DeepSeek-V3/R1 EP4 (256 / 4 local experts)
        (256, 3072, 1536, 8),  # MiniMax TP2
        (256, 3072, 768, 8),  # MiniMax TP4
        (256, 3072, 512, 8),  # MiniMax-M3 (inter 384 -> 512)
        (256, 3072, 256, 8),  # MiniMax-M2 TP8 (moe_inter 1536 / 8 = 192 -> 256)
        (512, 4096, 256, 10),  # Qwen3.5-397B
        (512, 4096, 512, 10),  # Qwen3.5-397B-A17B TP2, shared expert not fused (moe_inter 1024 / 2)
        (513, 4096, 512, 11),  # Qwen3.5-397B-A17B TP2, shared expert fused (moe_inter 1024 / 2)
        (48, 7168, 3072, 6),  # DeepSeek-V4 EP8
        (24, 7168, 3072, 6),  # DeepSeek-V4 EP16 (384 / 16 local experts)
        (384, 7168, 1536, 6),  # DeepSeek-V4 TP2
        (384, 7168, 768, 6),  # DeepSeek-V4 TP4
        (384, 7168, 512, 6),  # DeepSeek-V4 TP6/TP8
        (385, 7168, 1536, 7),  # DeepSeek-V4 TP2, shared expert fused (moe_inter 3072 / 2)
        (385, 7168, 768, 7),  # DeepSeek-V4 TP4, shared expert fused (moe_inter 3072 / 4)
        (385, 7168, 512, 7),  # DeepSeek-V4 TP6/TP8, shared expert fused (moe_inter 3072 / 6 or / 8)
        (256, 4096, 256, 6),  # DeepSeek-V4-Lite
        (256, 4096, 2048, 6),  # DeepSeek-V4-Flash TP1, shared expert not fused (moe_inter 2048)
        (289, 4096, 2048, 9),  # GLM-5.3-Flash (no AITER aux instance: aiter#5156)
        (128, 4096, 1536, 8),  # Qwen3-235B-A22B TP1 (moe_inter 1536)
        (128, 4096, 768, 8),  # Qwen3-235B-A22B TP2 (moe_inter 1536 / 2)
        (128, 4096, 512, 8),  # Qwen3-235B-A22B TP4 (moe_inter 1536 / 4 = 384 -> 512)
        (128, 4096, 256, 8),  # Qwen3-235B-A22B TP8 (moe_inter 1536 / 8 = 192 -> 256)
        (257, 4096, 2048, 7),  # DeepSeek-V4-Flash TP1, shared expert fused (moe_inter 2048)
        (257, 4096, 1024, 7),  # DeepSeek-V4-Flash TP2, shared expert fused (moe_inter 2048 / 2)
        (257, 4096, 512, 7),  # DeepSeek-V4-Flash TP4, shared expert fused (moe_inter 2048 / 4)
        (257, 4096, 256, 7),  # DeepSeek-V4-Flash TP8, shared expert fused (moe_inter 2048 / 8)
        (384, 5120, 768, 6),  # no public model
        (384, 5120, 1280, 6),  # no public model
        (128, 5120, 768, 3),  # no public model
        (128, 5120, 1280, 3),  # no public model
        (96, 5120, 2304, 6),  # DeepSeek-V4.1-Flash TP4+EP
        (32, 5120, 2304, 2),  # no public model
        (32, 5120, 2304, 3),  # no public model
        (257, 6144, 2048, 9),  # GLM-5.2 TP1 (moe_inter 2048, as the TP4/TP8 lines)
        (257, 6144, 1024, 9),  # GLM-5.2 TP2 (moe_inter 2048 / 2)
        (257, 6144, 512, 9),  # GLM-5.2 TP4
        (257, 6144, 256, 9),  # GLM-5.2 TP8
        (129, 6144, 512, 5),  # no public model
        (129, 6144, 768, 5),  # no public model
        (256, 6144, 512, 8),  # GLM-5.2 routed-only TP4
        (896, 3584, 512, 16),  # Kimi-K3
        (896, 3584, 3072, 16),  # no public model
        (56, 3584, 3072, 16),  # no public model
        (128, 3072, 512, 4),  # gpt-oss-120b TP8 (hidden 2880 padded to 3072; inter 360 -> 512)
        (128, 3072, 1536, 4),  # gpt-oss-120b TP2 (hidden 2880 padded to 3072; inter 1440 -> 1536)
        (128, 3072, 3072, 4),  # gpt-oss-120b TP1 (hidden 2880 padded to 3072; inter 2880 -> 3072)
        (128, 3072, 768, 4),  # gpt-oss-120b TP4 (hidden 2880 padded to 3072; inter 2880 / 4 -> 768)
        (32, 3072, 3072, 4),  # gpt-oss-20b TP1 (hidden 2880 padded to 3072; inter 2880 -> 3072)
        (32, 3072, 1536, 4),  # gpt-oss-20b TP2 (hidden 2880 padded to 3072; inter 2880 / 2 -> 1536)
        (32, 3072, 768, 4),  # gpt-oss-20b TP4 (hidden 2880 padded to 3072; inter 2880 / 4 -> 768)
        (32, 3072, 512, 4),  # gpt-oss-20b TP8 (hidden 2880 padded to 3072; inter 2880 / 8 -> 512)
        (513, 2560, 768, 11),  # Qwen3.8-Flash-Next TP1 (inter 640 -> 768)
        (513, 8192, 256, 11),  # Qwen3.8 TP8, shared expert fused
    }
)

_SCATTER_KEYS = frozenset((s[1], s[3]) for s in MXFP4_MOE_SUPPORTED_SHAPES)


def round_inter_dim(inter_dim: int) -> int:
    """``inter_dim`` rounded up to a multiple of 256."""
    return round_inter(inter_dim)


def _catalog_key(expert, model_dim, inter_dim, topk) -> tuple[int, int, int, int]:
    """The catalog's key of a layer: each value an int (else ``TypeError`` naming it, never
    converted), ``inter_dim`` rounded up to a multiple of 256."""
    from ..validation.ints import validate_int  # (the validation package imports torch)

    e, d, i, k = (validate_int(expert, "expert"), validate_int(model_dim, "model_dim"),
                  validate_int(inter_dim, "inter_dim"), validate_int(topk, "topk"))  # fmt: skip
    return e, d, round_inter_dim(i), k


def is_mxfp4_moe_shape_supported(expert: int, model_dim: int, inter_dim: int, topk: int) -> bool:
    """True when the catalog holds this MoE layer: its kernels are prebuilt (`aiter-aux
    build`, the prebuilt wheel).  Another shape may still be served, built on demand at
    its first call: :func:`mxfp4_moe_shape_status` says whether it can be.

    ``expert`` counts a fused shared expert (odd counts), ``topk`` counts it too;
    ``inter_dim`` is rounded up to a multiple of 256 before the lookup, so
    ``(513, 2560, 640, 11)`` is supported through the catalog entry ``(513, 2560, 768, 11)``.
    """
    return _catalog_key(expert, model_dim, inter_dim, topk) in MXFP4_MOE_SUPPORTED_SHAPES


class ShapeStatus(NamedTuple):
    """What :func:`mxfp4_moe_shape_status` says of one MoE layer shape."""

    servable: bool  #: the ops can serve it (prebuilt, or built on demand at first use)
    prebuilt: bool  #: the catalog holds it: `aiter-aux build` and the wheel prebuild it
    reason: str  #: why it is not servable; of a servable one, the ops it leaves out ("": none)


def mxfp4_moe_shape_status(expert: int, model_dim: int, inter_dim: int, topk: int) -> ShapeStatus:
    """Whether the aux path can serve this MoE layer at all, and whether its instances are
    prebuilt.  A servable shape that is not prebuilt is built on demand by its first op
    call (a few seconds per instance; nothing under ``AITER_AUX_DISABLE_JIT=1``).

    ``servable`` holds when the shape keeps the rules of the shapes an instance of every op
    compiles for (``codegen/catalog.py``: expert in [1, 1024], model_dim a positive multiple
    of 256, topk in [1, min(expert, 255)]).  model_dim's rules are the ops': a multiple of
    256 for moe_sort_scales and moe_sort_quant's ``sorted_scales`` (the grouped GEMM's scale
    layout), of 32 for the ops that read or write MX blocks, any for the others; ``reason``
    names the ops a model_dim breaks the rule of and says that the others serve it (gpt-oss's
    2880 is served by every op but those two).  A servable shape whose topk is above the
    gate's 16 is served by every op but ``moe_route`` and ``moe_route_sort_quant``, which
    ``reason`` then says.  ``prebuilt`` is
    :func:`is_mxfp4_moe_shape_supported`: the catalog lists the shape, so ``aiter-aux build``
    and a wheel build it ahead of use.  It does not say that this process's cache holds the
    build yet (``aiter-aux doctor`` and ``aiter-aux list --cached`` do).  An argument that
    is not an int (a bool, a float, a string) raises ``TypeError`` naming it.
    """
    from ..jit.paths import codegen_module

    shape = _catalog_key(expert, model_dim, inter_dim, topk)
    k = shape[3]
    errors = codegen_module("catalog").validate_shape(shape)
    reason = "; ".join(e.removeprefix(f"{shape}: ") for e in errors)
    route_topk = codegen_module("limits").ROUTE_TOPK
    if not errors and k > route_topk.hi:  # the gate's runtime limit: the layer is served
        reason = (f"moe_route and moe_route_sort_quant serve topk <= {route_topk.hi} "
                  f"({route_topk.why}); the other ops serve topk {k}")  # fmt: skip
    return ShapeStatus(not errors, shape in MXFP4_MOE_SUPPORTED_SHAPES, reason)


def is_mxfp4_moe_scatter_supported(model_dim: int, topk: int) -> bool:
    """True when moe_scatter_reduce / moe_scatter_reduce_q have a prebuilt instance for
    ``(model_dim, topk)`` (some catalog shape has that model_dim and topk); another is built
    on demand by its first call."""
    from ..validation.ints import validate_int

    return (validate_int(model_dim, "model_dim"), validate_int(topk, "topk")) in _SCATTER_KEYS


def __getattr__(name: str):
    # The ops, as AITER's module offers them next to the predicates.  Dunder lookups
    # (``__path__`` during a from-import, ``__wrapped__``...) never load the ops.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _ops

    if name in _ops.__all__:
        return getattr(_ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
