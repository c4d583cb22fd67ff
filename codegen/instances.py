"""Shape catalog -> kernel instances.

A *shape* is ``(expert, model_dim, inter_rounded, topk)``.  Each aux op is specialised at
compile time on a subset of the shape's parameters; an *instance* is one op with concrete
values for exactly those parameters, and its *key* (e.g. ``moe_sort_e257_k9``) spells
them.  inter_dim is a compile-time parameter of no aux kernel, so shapes that differ only
in inter share every instance.  The key is the one name of an instance everywhere: file
names, C symbols, the lookup and the Python dispatch.

Stdlib only: imported by the generator, by the JIT builder and by the Python ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .ops import OPS
from .opspec import MAX_PARAMS, OpSpec

BACKENDS = ("cpu", "cuda", "rocm")


def instance_key(op: str, **params: int) -> str:
    """The procedural name of an instance: ``<op>_<letter><value>...`` in template order,
    e.g. ``instance_key("moe_sort", num_experts=257, topk=9) == "moe_sort_e257_k9"``."""
    spec = OPS[op]
    return op + "".join(
        f"_{letter}{int(params[p])}" for p, letter in zip(spec.params, spec.key_parts, strict=True)
    )


@dataclass(frozen=True, order=True)
class Instance:
    """One op specialised at compile time; ordered and identified by ``key``."""

    key: str
    op: str
    values: tuple[int, ...]  # compile-time parameter values, template order

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def symbol(self) -> str:
        return "aiter_aux_" + self.key

    @property
    def template_args(self) -> str:
        return ", ".join(str(v) for v in self.values)

    @property
    def padded_values(self) -> tuple[int, ...]:
        """``values`` padded with zeros to :data:`MAX_PARAMS` (the lookup's layout)."""
        return self.values + (0,) * (MAX_PARAMS - len(self.values))

    @property
    def params(self) -> dict[str, int]:
        return dict(zip(self.spec.params, self.values, strict=True))


def shape_params(shape: tuple[int, int, int, int]) -> dict[str, int]:
    expert, model_dim, _inter, topk = shape
    return {"num_experts": expert, "model_dim": model_dim, "topk": topk}


def instances_for_shape(shape: tuple[int, int, int, int]) -> list[Instance]:
    """The instances (one per op) that the aux path of ``shape`` dispatches to."""
    params = shape_params(shape)
    out = []
    for spec in OPS.values():
        values = tuple(params[p] for p in spec.params)
        out.append(Instance(instance_key(spec.name, **params), spec.name, values))
    return out


def enumerate_instances(shapes: Iterable[tuple[int, int, int, int]]) -> list[Instance]:
    """Unique instances of every shape, sorted by key (each key once)."""
    unique: dict[str, Instance] = {}
    for shape in shapes:
        for inst in instances_for_shape(tuple(shape)):
            unique.setdefault(inst.key, inst)
    return sorted(unique.values())
