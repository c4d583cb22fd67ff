"""The shape catalog of module_moe_mxfp4_aux and the rules every catalog shape obeys.

``SHAPES`` is the codegen copy of the supported-shape catalog; it must equal
``MXFP4_MOE_SUPPORTED_SHAPES`` in ``aiter_aux/ops/moe_mxfp4_aux.py`` (the AST test in
``op_tests/test_mxfp4_moe_aux_codegen.py`` checks it).  Each tuple is
``(expert, model_dim, inter_rounded, topk)``, one per line with a comment naming its model;
``expert`` counts a fused shared expert where it is odd, and ``topk`` then counts it too.
Add a shape with ``aiter-aux add-shape E,MODEL_DIM,INTER,TOPK`` or by hand in both lists.

The rules (:func:`validate_shape`): expert in [1, :data:`MAX_EXPERTS`], model_dim and
inter_rounded positive multiples of :data:`MODEL_DIM_ALIGN` / :data:`INTER_ALIGN` up to
:data:`MAX_MODEL_DIM` / :data:`MAX_INTER`, topk in [1, min(expert, :data:`MAX_TOPK`)]; the
bounds are what the kernels compile, from ``codegen/limits.py`` (the one place limits live):
:data:`MODEL_DIM_ALIGN` is the strictest of its ``MODEL_DIM_RULES`` (moe_sort_scales'), and
a message names the ops whose rule a model_dim breaks.
:func:`round_inter` is the one rounding of inter_dim.

Stdlib only and free of code generation: the load path reads the catalog from here without
importing the generator (nor jinja2); the generator, the JIT, ``aiter-aux add-shape`` /
``remove-shape`` and :mod:`aiter_aux.shapes` import it too, and add-shape executes this
file alone (``aiter_aux.jit.paths.catalog_on_disk``): limits.py is then read by its path.
"""

from __future__ import annotations

from collections.abc import Iterable

try:
    from . import limits as _limits
except ImportError:  # executed alone, outside the codegen package: limits.py next to it
    import importlib.util as _util
    import sys as _sys
    from pathlib import Path as _Path

    _spec = _util.spec_from_file_location(
        "aiter_aux_catalog_limits", _Path(__file__).with_name("limits.py")
    )
    _limits = _util.module_from_spec(_spec)
    _sys.modules[_spec.name] = _limits  # dataclasses look their module up while it executes
    try:
        _spec.loader.exec_module(_limits)
    finally:
        del _sys.modules[_spec.name]

INTER_ALIGN = 256
MODEL_DIM_ALIGN = max(rule.of for rule in _limits.MODEL_DIM_RULES)
MAX_EXPERTS = _limits.NUM_EXPERTS.hi
MAX_TOPK = _limits.TOPK.hi
MAX_MODEL_DIM = _limits.MODEL_DIM.hi
MAX_INTER = _limits.INTER.hi


def round_inter(inter_dim: int) -> int:
    """inter_dim rounded up to a multiple of :data:`INTER_ALIGN` (the catalog stores the
    rounded value)."""
    return -(-int(inter_dim) // INTER_ALIGN) * INTER_ALIGN


def model_dim_rules_broken(model_dim: int) -> str:
    """What each op that cannot serve ``model_dim`` needs of it (``_limits.MODEL_DIM_RULES``),
    e.g. ``"model_dim must be a positive multiple of 256 for moe_sort_scales and ... (why);
    the other ops serve model_dim 2880"``."""
    broken = [r for r in _limits.MODEL_DIM_RULES if model_dim <= 0 or model_dim % r.of]
    parts = [f"of {r.of} for {_and(r.ops)} ({r.why})" for r in broken]
    msg = "model_dim must be a positive multiple " + ", and ".join(parts)
    return msg + (f"; the other ops serve model_dim {model_dim}" if model_dim > 0 else "")


def _and(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def validate_shape(shape: object) -> list[str]:
    """Rule violations of one catalog tuple (empty when valid)."""
    if not (isinstance(shape, tuple) and len(shape) == 4 and all(type(v) is int for v in shape)):
        return [f"{shape!r}: must be a tuple of 4 ints (expert, model_dim, inter_rounded, topk)"]
    expert, model_dim, inter, topk = shape
    errors = []
    if not 1 <= expert <= MAX_EXPERTS:
        errors.append(f"{shape}: expert must be in [1, {MAX_EXPERTS}]")
    if model_dim <= 0 or model_dim % MODEL_DIM_ALIGN:
        msg = f"{shape}: {model_dim_rules_broken(model_dim)}"
        padded = -(-model_dim // MODEL_DIM_ALIGN) * MODEL_DIM_ALIGN
        if 0 < padded <= MAX_MODEL_DIM:
            msg += f"; pad the hidden size to {padded} (add-shape --from-config does so)"
        elif model_dim > 0:  # no padding serves it: say so rather than name a refused value
            msg += (f" at most {MAX_MODEL_DIM} ({_limits.MODEL_DIM.why}): none from "
                    f"{model_dim} up is, so no padding serves it")  # fmt: skip
        errors.append(msg)
    elif model_dim > MAX_MODEL_DIM:
        errors.append(f"{shape}: model_dim must be at most {MAX_MODEL_DIM} "
                      f"({_limits.MODEL_DIM.why})")  # fmt: skip
    if inter <= 0 or inter % INTER_ALIGN:
        errors.append(f"{shape}: inter_rounded must be a positive multiple of {INTER_ALIGN}")
    elif inter > MAX_INTER:
        errors.append(f"{shape}: inter_rounded must be at most {MAX_INTER} ({_limits.INTER.why})")
    if not 1 <= topk <= min(expert, MAX_TOPK):
        errors.append(f"{shape}: topk must be in [1, min(expert, {MAX_TOPK})]")
    return errors


def validate_catalog(shapes: Iterable[object]) -> list[str]:
    """Rule violations of a whole catalog, duplicates included."""
    errors: list[str] = []
    seen: set[object] = set()
    for shape in shapes:
        errors.extend(validate_shape(shape))
        if shape in seen:
            errors.append(f"{shape}: listed more than once")
        seen.add(shape)
    return errors


# (expert, model_dim, inter_rounded, topk)
SHAPES = [
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
]
