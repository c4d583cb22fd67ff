"""Shape catalog -> kernel instances.

A *shape* is ``(expert, model_dim, inter_rounded, topk)``.  Each aux op's GPU kernels are
specialised at compile time on a subset of the shape's parameters; an *instance* is one op
with concrete values for exactly those parameters, and its *key* (e.g. ``moe_sort_e257_k9``)
spells them.  The CPU kernels are generic (compiled once per module, the shape read at run
time); a CPU instance names its key and calls its op's kernel.  inter_dim is a compile-time
parameter of no aux kernel, so shapes that differ only in inter share every instance.  The
key is the one name of an instance everywhere: file names, C symbols, the lookup and the
Python dispatch.

Stdlib only: imported by the generator, by the JIT builder and by the Python ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from . import exprs
from .ops import OPS
from .opspec import MAX_PARAMS, OpSpec, Rule

BACKENDS = ("cpu", "cuda", "rocm")
#: The ops with kernels and instances of their own (a composed op runs its parts').
INSTANCE_OPS = tuple(name for name, spec in OPS.items() if not spec.composes)


def instance_key(op: str, **params: int) -> str:
    """The procedural name of an instance: ``<op>_<letter><value>...`` in template order,
    e.g. ``instance_key("moe_sort", num_experts=257, topk=9) == "moe_sort_e257_k9"``."""
    spec = OPS[op]
    return op + "".join(
        f"_{letter}{int(params[p])}" for p, letter in zip(spec.params, spec.key_parts, strict=True)
    )


def call_keys(op: str, **params: int) -> list[str]:
    """The keys of the instances a call of ``op`` launches, in order: its own, or each part's
    of a composed op (its parameters ``op``'s of the same names)."""
    parts = [p for p, _member in OPS[op].composes] or [op]
    return [instance_key(p, **{n: params[n] for n in OPS[p].params}) for p in parts]


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


def instance_headers(backend: str, op: str) -> list[str]:
    """What an instance TU of ``op`` includes (relative to the kernels directory).  On a GPU
    its op's kernel header alone (the op table's ``kernels``, after the GPU kernels' common
    header), so an edit of another op's kernels leaves it alone.  On the CPU the ABI header
    alone: the kernels there are generic (:func:`cpu_kernel_units`), and an instance only
    names its key and calls its op's kernel, so no kernel edit recompiles it."""
    if backend == "cpu":
        return ["mxfp4_moe_aux_abi.h"]
    return ["gpu/common.h", "gpu/" + OPS[op].kernels[1]]


#: The name of the CPU backend's kernels TU of a kernel header, e.g. ``kernels_core_cpu``.
CPU_KERNELS_PREFIX = "kernels_"


def cpu_kernel_units() -> dict[str, list[str]]:
    """The CPU backend's kernels TUs, ``{stem: [op names]}`` in table order: one per CPU
    kernel header of the op table (``kernels[0]``), which compiles the generic kernel
    (every shape parameter read at run time) of each of its ops once per module, e.g.
    ``{"kernels_core_cpu": ["moe_sort", ...], ...}``."""
    units: dict[str, list[str]] = {}
    for spec in map(OPS.get, INSTANCE_OPS):
        stem = CPU_KERNELS_PREFIX + spec.kernels[0].removesuffix(".h")
        units.setdefault(stem, []).append(spec.name)
    return units


def module_units(backend: str) -> tuple[str, ...]:
    """The TUs of a module besides its instances (the module of no shape): the lookup, the
    backend-independent part and the binding, and on the CPU the kernels TUs."""
    kernels = tuple(cpu_kernel_units()) if backend == "cpu" else ()
    return ("lookup", "module_common", "binding", *kernels)


def instance_of_key(key: str) -> Instance:
    """The instance a key names (the inverse of :func:`instance_key`); ``ValueError`` for a
    key no op of the table spells."""
    for spec in sorted(OPS.values(), key=lambda s: -len(s.name)):  # longest op name first
        if key != spec.name and not key.startswith(spec.name + "_"):
            continue
        parts = key[len(spec.name) :].split("_")[1:]
        if len(parts) != len(spec.params):
            continue
        try:
            values = tuple(
                int(p[len(letter) :])
                for p, letter in zip(parts, spec.key_parts, strict=True)
                if p.startswith(letter)
            )
        except ValueError:
            continue
        if (
            len(values) == len(spec.params)
            and instance_key(spec.name, **dict(zip(spec.params, values, strict=True))) == key
        ):
            return Instance(key, spec.name, values)
    raise ValueError(f"{key!r} is no instance key of the op table")


def shape_params(shape: tuple[int, int, int, int]) -> dict[str, int]:
    expert, model_dim, _inter, topk = shape
    return {"num_experts": expert, "model_dim": model_dim, "topk": topk}


@cache
def _param_rules(op: str) -> tuple:
    """The rules of ``op`` over its compile-time parameters alone, compiled (once per op)."""
    spec = OPS[op]
    return tuple(
        compile(exprs.to_python(rule.cond, exprs.Scope()), f"<{op} rule>", "eval")
        for rule in spec.checks
        if isinstance(rule, Rule)
        and rule.when is None
        and exprs.names(rule.cond) <= set(spec.params)
    )


def refused(spec: OpSpec, params: dict[str, int]) -> bool:
    """True where a rule of ``spec`` over its compile-time parameters alone fails for
    ``params``: the op refuses every call such an instance could serve (the SGLang align
    above 1023 experts), so no shape builds it."""
    rules = _param_rules(spec.name)
    values = {p: params[p] for p in spec.params}
    return any(not eval(rule, {}, values) for rule in rules)


def instances_for_shape(shape: tuple[int, int, int, int]) -> list[Instance]:
    """The instances (one per op with kernels: a composed op runs its parts') that the aux
    path of ``shape`` dispatches to: those of every op that does not refuse the shape's
    parameters (:func:`refused`)."""
    params = shape_params(shape)
    out = []
    for spec in map(OPS.get, INSTANCE_OPS):
        if refused(spec, params):
            continue
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
