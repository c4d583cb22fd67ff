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

BACKENDS = ("cpu", "cuda", "rocm")


@dataclass(frozen=True)
class OpSpec:
    """One aux op, defined once.  Everything else is generated from or checked against it:
    the instance keys and the lookup (``key_parts``, ``op_enum``), the torch schemas of the
    allocating op ``<name>`` and of ``<name>_out`` (:func:`schemas`), the C++ signatures the
    binding must define (:func:`cpp_signature`, checked by ``static_assert`` at build time)
    and the Python signatures of :mod:`aiter_aux.ops`.

    * ``params``: the compile-time parameters of the kernel template, in template order.
    * ``struct``: the C args struct of ``mxfp4_moe_aux_abi.h`` the instance function takes.
    * ``inputs``: schema of the run-time inputs (positional).
    * ``outputs``: names of the output buffers, in order (the allocating op returns them;
      ``<name>_out`` takes them as mutated arguments after ``inputs``).
    * ``kwargs``: schema of keyword-only inputs (both forms).
    """

    name: str
    params: tuple[str, ...]
    struct: str
    op_enum: str
    key_parts: tuple[str, ...]  # key suffix letters, one per param
    inputs: str = ""
    outputs: tuple[str, ...] = ()
    kwargs: str = ""


_SORT_OUTPUTS = ("sorted_token_ids", "sorted_weights", "m_indices", "sorted_expert_ids",
                 "num_valid_ids", "reverse_sorted")  # fmt: skip
_SORT_INPUTS = "Tensor topk_ids, Tensor topk_weights, int num_experts, int block_m"
_ZERO_BUF = "Tensor(z!)? zero_buf=None, Tensor? expert_map=None, Tensor? zero_buf_init=None"
_SORTED_SCALES = ", Tensor(s!)? sorted_scales=None"  # the fused sort+quant ops only
_SCALE = "float routed_scaling_factor=1.0"

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("moe_sort", ("num_experts", "topk"), "AiterAuxSortArgs", "AITER_AUX_OP_MOE_SORT",
               ("e", "k"), _SORT_INPUTS, _SORT_OUTPUTS, _ZERO_BUF),
        OpSpec("mxfp4_quant", ("model_dim",), "AiterAuxQuantArgs", "AITER_AUX_OP_MXFP4_QUANT",
               ("d",), "Tensor x", ("a_q", "a_scale")),
        OpSpec("moe_sort_quant", ("num_experts", "topk", "model_dim"), "AiterAuxSortQuantArgs",
               "AITER_AUX_OP_MOE_SORT_QUANT", ("e", "k", "d"),
               "Tensor topk_ids, Tensor topk_weights, Tensor x, int num_experts, int block_m",
               _SORT_OUTPUTS + ("a_q", "a_scale"), _ZERO_BUF + _SORTED_SCALES),
        OpSpec("moe_sort_scales", ("model_dim",), "AiterAuxSortScalesArgs",
               "AITER_AUX_OP_MOE_SORT_SCALES", ("d",),
               "Tensor a_scale, Tensor sorted_token_ids, Tensor num_valid_ids, int block_m",
               ("sorted_scales",)),
        OpSpec("moe_scatter_reduce", ("model_dim", "topk"), "AiterAuxScatterArgs",
               "AITER_AUX_OP_MOE_SCATTER_REDUCE", ("d", "k"),
               "Tensor expert_out, Tensor reverse_sorted, Tensor sorted_weights, int topk",
               ("out",), _SCALE),
        OpSpec("moe_scatter_reduce_q", ("model_dim", "topk"), "AiterAuxScatterArgs",
               "AITER_AUX_OP_MOE_SCATTER_REDUCE_Q", ("d", "k"),
               "Tensor expert_out_q, Tensor expert_out_scale, Tensor reverse_sorted, "
               "Tensor sorted_weights, int topk",
               ("out",), _SCALE),
        # MXFP8 (a8w4): a_q holds one E4M3 byte per element, uint8 [M, model_dim]
        OpSpec("mxfp8_quant", ("model_dim",), "AiterAuxQuantArgs", "AITER_AUX_OP_MXFP8_QUANT",
               ("d",), "Tensor x", ("a_q", "a_scale")),
        OpSpec("moe_sort_quant_fp8", ("num_experts", "topk", "model_dim"),
               "AiterAuxSortQuantArgs", "AITER_AUX_OP_MOE_SORT_QUANT_FP8", ("e", "k", "d"),
               "Tensor topk_ids, Tensor topk_weights, Tensor x, int num_experts, int block_m",
               _SORT_OUTPUTS + ("a_q", "a_scale"), _ZERO_BUF + _SORTED_SCALES),
    )
}  # fmt: skip

MAX_PARAMS = 3  # compile-time parameters of any op (the lookup stores this many values)


def schemas(spec: OpSpec) -> tuple[str, str]:
    """The torch schemas ``(allocating, out)`` of ``spec``: ``<name>(inputs, *, kwargs) ->
    (Tensor, ...)`` and ``<name>_out(inputs, Tensor(a!) out0, ..., *, kwargs) -> ()``."""
    kw = f", *, {spec.kwargs}" if spec.kwargs else ""
    rets = ", ".join("Tensor" for _ in spec.outputs)
    rets = rets if len(spec.outputs) == 1 else f"({rets})"
    mutated = ", ".join(f"Tensor({chr(ord('a') + i)}!) {o}" for i, o in enumerate(spec.outputs))
    return (
        f"{spec.name}({spec.inputs}{kw}) -> {rets}",
        f"{spec.name}_out({spec.inputs}, {mutated}{kw}) -> ()",
    )


_CPP_TYPES = {"Tensor": "const Tensor&", "Tensor?": "const std::optional<Tensor>&",
              "int": "int64_t", "float": "double"}  # fmt: skip


def schema_args(schema: str) -> list[tuple[str, str]]:
    """``[(type, name), ...]`` of a schema's arguments; alias annotations and defaults are
    dropped (``Tensor(a!)? zero_buf=None`` -> ``("Tensor?", "zero_buf")``)."""
    inner = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    out = []
    for part in (p.strip() for p in inner.split(",")):
        if part == "*":
            continue
        typ, name = part.split("=")[0].split()
        base = typ.split("(")[0].rstrip("?") + ("?" if typ.endswith("?") else "")
        out.append((base, name))
    return out


def cpp_signature(schema: str) -> str:
    """The C++ function type the binding must give the op of ``schema`` (stable ABI types:
    ``Tensor`` is ``torch::stable::Tensor``), e.g. ``void(const Tensor&, int64_t)``."""
    args = ", ".join(_CPP_TYPES[t] for t, _ in schema_args(schema))
    rets = schema[schema.rindex("->") + 2 :].strip()
    n = 0 if rets == "()" else rets.count("Tensor")
    ret = "void" if n == 0 else "Tensor" if n == 1 else f"std::tuple<{', '.join(['Tensor'] * n)}>"
    return f"{ret}({args})"


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
