"""Checks of the op table itself (:mod:`codegen.ops`), run by every generation: a mistake in
a table entry is an :class:`OpTableError` naming the op, the field and what to write, not a
``KeyError`` in the generator or an error in the generated C++.
"""

from __future__ import annotations

from . import exprs
from .checks import CPP_DTYPE, CallPlan
from .limits import LIMITS
from .opspec import Float, Int, Limit, OpSpec, Rule, Size, Tensor
from .registry import KERNELS, ROOT

HELPERS = ("numel", "shape", "sort_capacity", "sort_scales_rows", "max", "rows_in_range",
           "expert_map_ptr", "min", "vllm_align_capacity", "sglang_align_capacity")  # fmt: skip


class OpTableError(ValueError):
    """An op table entry that cannot be generated."""


_SCOPE = exprs.Scope()


def _names(expr: str, where: str) -> set[str]:
    try:
        exprs.to_cpp(expr, _SCOPE)  # parses and checks the syntax it supports
    except exprs.ExprError as e:
        raise OpTableError(f"{where}: {e}") from None
    return exprs.names(expr)


def validate(ops: dict[str, OpSpec]) -> None:
    """Raise :class:`OpTableError` for the first problem of ``ops``."""
    ids: dict[int, str] = {}
    for name, spec in ops.items():
        where = f"codegen/ops.py, op {name!r}"
        if spec.name != name:
            raise OpTableError(f"{where}: listed under another name ({spec.name!r})")
        if spec.op_id <= 0 or spec.op_id in ids:
            other = ids.get(spec.op_id)
            raise OpTableError(
                f"{where}: op_id {spec.op_id} must be a positive int no other op uses"
                + (f" (also {other!r})" if other else "")
            )
        ids[spec.op_id] = name
        if len(spec.key_parts) != len(spec.params):
            raise OpTableError(
                f"{where}: key_parts {spec.key_parts} needs one letter per compile-time "
                f"parameter {spec.params}"
            )
        _validate_composes(spec, ops, where)
        _validate_args(spec, where)
        plan, bound = CallPlan(spec, True), set()
        tensors = {t.name for t in spec.tensors()} | {o.name for o in spec.outputs}
        global _SCOPE
        _SCOPE = exprs.Scope(frozenset(tensors))
        bound |= {a.name for a in spec.args() if isinstance(a, Int | Float)}
        for kind, data in plan.steps():
            if kind == "tensor":
                t, binds, _shape = data
                bound |= {d for d, _ in binds}
                for d in t.dims or ():
                    _use(_names(d, f"{where}, dims of {t.name}"), bound, tensors, where)
            elif kind in ("rule", "size"):
                expr = data.cond if kind == "rule" else data.expr
                _use(_names(expr, f"{where}, {expr!r}"), bound, tensors, where)
                if kind == "rule":
                    _use(_message_names(data, where), bound, tensors, where)
                else:
                    bound.add(data.name)
            elif kind == "buffer":
                for d in data.dims:
                    _use(_names(d, f"{where}, dims of {data.name}"), bound, tensors, where)
        for p in spec.params:
            if p not in bound:
                raise OpTableError(
                    f"{where}: compile-time parameter {p!r} is neither an int argument nor a "
                    "size the checks bind"
                )
        for f in _flat(spec.fill):
            if f == "nullptr":  # an unused pointer field
                continue
            _use(_names(f, f"{where}, fill {f!r}"), bound, tensors, where)


def _validate_args(spec: OpSpec, where: str) -> None:
    seen: set[str] = set()
    for a in spec.args() + spec.outputs:
        if a.name in seen:
            raise OpTableError(f"{where}: argument {a.name!r} listed twice")
        seen.add(a.name)
        if isinstance(a, Tensor) and a.dtype.startswith("="):
            ref = a.dtype[1:]
            if ref not in {t.name for t in spec.tensors() if not t.optional}:
                raise OpTableError(
                    f"{where}: {a.name} has dtype {a.dtype!r}; '=' names a required tensor "
                    "argument"
                )
        elif isinstance(a, Tensor) and a.dtype not in CPP_DTYPE:
            raise OpTableError(
                f"{where}: {a.name} has dtype {a.dtype!r}; the table knows {sorted(CPP_DTYPE)} "
                "(add a new one to CPP_DTYPE / PY_DTYPE of codegen/checks.py and to "
                "binding/checks.h)"
            )
    for c in spec.checks:
        if isinstance(c, Limit) and c.limit not in LIMITS:
            raise OpTableError(f"{where}: Limit {c.limit!r} is not one of {sorted(LIMITS)}")
        if not isinstance(c, Limit | Rule | Size):
            raise OpTableError(f"{where}: checks take Limit, Rule or Size, got {c!r}")
    if spec.python_select and not spec.python_name:
        raise OpTableError(f"{where}: python_select needs python_name (the shared function)")
    if not [t for t in spec.tensors() if not t.optional]:
        raise OpTableError(f"{where}: an op needs a required tensor input (it gives the device)")
    _validate_sources(spec, where)


def _validate_composes(spec: OpSpec, ops: dict[str, OpSpec], where: str) -> None:
    """A composed op's parts are other, plain ops of the table whose compile-time parameters
    the op has too (the binding finds their instances from its own values)."""
    for part in spec.composes:
        if not (isinstance(part, tuple) and len(part) == 2 and all(isinstance(x, str) and x
                                                                  for x in part)):  # fmt: skip
            raise OpTableError(f"{where}: composes needs (op, args member) pairs, got {part!r}")
        op, _member = part
        if op not in ops or op == spec.name or ops[op].composes:
            raise OpTableError(f"{where}: composes {op!r}, which is no other plain op of the table")
        missing = [p for p in ops[op].params if p not in spec.params]
        if missing:
            raise OpTableError(f"{where}: composes {op!r}, whose parameters {missing} it lacks")
    if spec.composes and spec.kernels:
        raise OpTableError(f"{where}: a composed op has no kernels of its own, got {spec.kernels}")


def _validate_sources(spec: OpSpec, where: str) -> None:
    """``kernels`` name headers that exist (they register the op's kernels; ``reference`` is
    checked where it is used, :func:`codegen.registry.render_reference_table`: the trees a
    wheel or a test builds from hold codegen/, templates/ and csrc/ only).  A composed op
    has none."""
    if spec.composes:
        return
    if len(spec.kernels) != 2:
        raise OpTableError(f"{where}: kernels must be (CPU header, GPU header), got {spec.kernels}")
    cpu, gpu = spec.kernels
    wanted = [(f"{KERNELS}/cpu/{cpu}", "kernels[0], the CPU header under cpu/"),
              (f"{KERNELS}/gpu/{gpu}", "kernels[1], the GPU header under gpu/")]  # fmt: skip
    for rel, what in wanted:
        if not rel.rsplit("/", 1)[1] or not (ROOT / rel).is_file():
            raise OpTableError(f"{where}: {what} must name an existing file, got {rel!r}")


def _message_names(rule: Rule, where: str) -> set[str]:
    names: set[str] = set()
    for _literal, field in exprs._fields(rule.message):
        if field is not None:
            names |= _names(field, f"{where}, message {rule.message!r}")
    return names


def _use(names: set[str], bound: set[str], tensors: set[str], where: str) -> None:
    unknown = sorted(n for n in names if n not in bound and n not in tensors and n != "None")
    if unknown:
        raise OpTableError(
            f"{where}: {', '.join(unknown)} is not bound at that point (bind it by a tensor's "
            "dims or a Size before its first use; tensors are used through numel() / shape())"
        )


def _flat(fill) -> list[str]:
    return [x for f in fill for x in (_flat(f) if isinstance(f, tuple) else [f])]
