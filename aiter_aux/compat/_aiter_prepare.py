"""``prepare_mxfp4_moe_aux(shapes)``: AITER's preflight (its tuner calls it before starting
workers) on our JIT: make sure every instance the given shapes dispatch to is built (on
demand where the catalog's prebuilt set lacks it) and loaded, or say which shapes no
instance can serve and why.

Imports torch, the catalog (``codegen``) and the JIT on first call only.
"""

from __future__ import annotations

from collections.abc import Iterable


class MissingInstancesError(RuntimeError):
    """Shapes passed to :func:`prepare_mxfp4_moe_aux` break a rule of the shapes an
    instance can serve (AITER raises a ``RuntimeError`` naming the missing keys too).

    Attributes:
        missing_keys: their instance keys the catalog's prebuilt set lacks, sorted.
        missing_shapes: those shapes ``(expert, model_dim, inter_dim, topk)``, in the order
            given.
    """

    def __init__(self, message: str, missing_keys: tuple[str, ...], missing_shapes: tuple):
        super().__init__(message)
        self.missing_keys = missing_keys
        self.missing_shapes = missing_shapes


def _shape(s: object) -> tuple[int, int, int, int]:
    from ..validation import validate_int

    try:
        values = tuple(s)  # type: ignore[arg-type]
    except TypeError:
        values = ()
    if len(values) != 4:
        raise ValueError(f"a shape is (expert, model_dim, inter_dim, topk), got {s!r}")
    names = ("expert", "model_dim", "inter_dim", "topk")
    return tuple(validate_int(v, n) for v, n in zip(values, names, strict=True))  # type: ignore


def _backend() -> str:
    """The module backend of this process's accelerator (``cuda`` / ``rocm``), else ``cpu``."""
    import torch

    from ..ops._library import backend_of

    return backend_of(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _problems(s: tuple[int, int, int, int]) -> list[str]:
    """The rules of the catalog shape ``s`` breaks (its inter_dim rounded as the catalog
    does): each names the ops it keeps from serving ``s``."""
    catalog = _codegen("catalog")
    e, d, inter, k = s
    return catalog.validate_shape((e, d, catalog.round_inter(inter), k))


def _codegen(name: str):
    from ..jit.paths import codegen_module

    return codegen_module(name)


def prepare_mxfp4_moe_aux(shapes: Iterable[tuple[int, int, int, int]]) -> None:
    """Build (or find) and load the module and every instance serving ``shapes`` on this
    process's backend (``cuda``/``rocm`` when torch sees a GPU, else ``cpu``): the catalog's
    prebuilt instances, and the others built on demand now rather than at their first call.

    Each shape is ``(expert, model_dim, inter_dim, topk)``; ``inter_dim`` is no parameter
    of any aux instance, so a new ``inter_dim`` of a known ``(expert, model_dim, topk)``
    needs nothing new (as in AITER).  No shapes: nothing is loaded or built.

    Raises:
        MissingInstancesError: (a ``RuntimeError``, as AITER's) a shape breaks a rule of
            what an instance can serve (expert in [1, 1024], model_dim a multiple of 256,
            topk in [1, min(expert, 255)]); the message names each rule (and of
            model_dim, the ops whose rule it breaks).
        ValueError, TypeError: a shape is not four ints.
        aiter_aux.jit.BuildError, JitDisabledError, ...: a build failed or is disabled.
    """
    given = [_shape(s) for s in shapes]
    if not given:
        return None
    from ..jit.spec import ModuleSpec, load_module

    instances = _codegen("instances")
    spec = ModuleSpec(_backend())
    bad = {s: errors for s in given if (errors := _problems(s))}
    if bad:
        keys = {i.key for s in bad for i in instances.instances_for_shape(s)}
        raise MissingInstancesError(
            "the aux ops cannot serve every op of "
            + "; ".join(f"{s}: {'; '.join(errors)}" for s, errors in bad.items()),
            tuple(sorted(keys - spec.keys)),
            tuple(bad),
        )
    need = sorted({i.key for s in given for i in instances.instances_for_shape(s)})
    for key in need:  # the module first (built if needed), then each key (on demand)
        load_module(spec.backend, key)
    return None
