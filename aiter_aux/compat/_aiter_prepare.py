"""``prepare_mxfp4_moe_aux(shapes)``: AITER's preflight (its tuner calls it before starting
workers) on our catalog and JIT: make sure every instance the given shapes dispatch to is
built and loaded, or say which are missing and how to add them.

Imports torch, the catalog (``codegen``) and the JIT on first call only.
"""

from __future__ import annotations

from collections.abc import Iterable


class MissingInstancesError(RuntimeError):
    """Shapes passed to :func:`prepare_mxfp4_moe_aux` dispatch to instances the catalog
    lacks (AITER raises a ``RuntimeError`` naming the missing keys too).

    Attributes:
        missing_keys: the instance keys, sorted (``moe_sort_e255_k8``, ...).
        missing_shapes: the given shapes ``(expert, model_dim, inter_dim, topk)`` that need
            one of them, in the order given.
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


def _how_to_add(shapes: list[tuple[int, int, int, int]]) -> str:
    catalog = _codegen("catalog")
    lines = []
    for s in shapes:
        e, d, inter, k = s
        rounded = (e, d, catalog.round_inter(inter), k)
        errors = catalog.validate_shape(rounded)
        if errors:
            lines.append(f"{s} cannot be added: {'; '.join(errors)}")
        else:
            lines.append(f"aiter-aux add-shape {e},{d},{inter},{k} --note MODEL")
    return "; ".join(lines)


def _codegen(name: str):
    from ..jit.paths import codegen_module

    return codegen_module(name)


def prepare_mxfp4_moe_aux(shapes: Iterable[tuple[int, int, int, int]]) -> None:
    """Build (or find) and load the module serving ``shapes`` on this process's backend
    (``cuda``/``rocm`` when torch sees a GPU, else ``cpu``), and check that it holds every
    instance the shapes dispatch to.

    Each shape is ``(expert, model_dim, inter_dim, topk)``; ``inter_dim`` is no parameter
    of any aux instance, so a new ``inter_dim`` of a catalog ``(expert, model_dim, topk)``
    needs nothing new (as in AITER).  No shapes: nothing is loaded or built.

    Raises:
        MissingInstancesError: (a ``RuntimeError``, as AITER's) the catalog this process
            imported has no instance for some key; the message names every missing key
            and the ``aiter-aux add-shape`` command that adds each shape (or the rule it
            breaks), after which the process must be restarted.
        ValueError, TypeError: a shape is not four ints.
        aiter_aux.jit.InstanceMissingError: the module already loaded in this process is
            older than the catalog (restart the process).
        aiter_aux.jit.BuildError, JitDisabledError, ...: the build failed or is disabled.
    """
    given = [_shape(s) for s in shapes]
    if not given:
        return None
    from ..jit.paths import codegen_changed
    from ..jit.spec import ModuleSpec, load_module

    instances = _codegen("instances")
    spec = ModuleSpec(_backend())
    per_shape = {s: {i.key for i in instances.instances_for_shape(s)} for s in given}
    need = sorted(set().union(*per_shape.values()))
    missing = tuple(k for k in need if k not in spec.keys)
    if missing:
        lacking = [s for s, keys in per_shape.items() if keys - spec.keys]
        stale = (
            " (codegen/ changed on disk since this process imported it: restart the process "
            "if the shape was added since)"
            if codegen_changed()
            else ""
        )
        raise MissingInstancesError(
            f"the catalog of module_moe_mxfp4_aux has no instance {', '.join(missing)}"
            f"{stale}.  Add each shape (add-shape edits the catalog and rebuilds): "
            f"{_how_to_add(lacking)}; then restart the process before launching workers",
            missing,
            tuple(lacking),
        )
    for key in need:  # builds the whole catalog if needed; a stale loaded module raises
        load_module(spec.backend, key)
    return None
