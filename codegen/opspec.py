"""What an op table entry holds (stdlib only); the table itself is :mod:`codegen.ops`.

An :class:`OpSpec` says everything about one op but the code of its kernels and its reference:
its arguments (dtype, rank and shape of each tensor as expressions in size variables such
as ``M``, ``topk``, ``model_dim``; which tensors it writes), the rules its sizes must
satisfy, its outputs, the compile-time parameters of its instances, how the C args struct
of its instances is filled, and its Python surface.  Generated from it:

* the torch schemas of ``<op>`` (allocating) and ``<op>_out`` (:func:`schemas`) and the C++
  types the binding's functions must have (:func:`cpp_signature`);
* the binding's argument checks, allocation and launch (``templates/binding.j2``, rendered
  into the build directory);
* the Python validators (``aiter_aux/validation/_checks.py``), the fake implementations and
  the typed wrappers with their ``__all__`` (``aiter_aux/ops/_ops.py``), checked in and
  stamped "generated" (``python codegen/gen_sources.py``; a test checks they are current);
* docs/api.md (``scripts/gen_api_md.py``, from the wrappers' signatures and docstrings).
* the op's registrations: the include lists of the kernel aggregators and the reference's
  exports (:mod:`codegen.registry`, from ``kernels`` and ``reference``).

Expressions (dims, sizes, rules, struct fields) are Python expression syntax over the size
variables, the int arguments and the tensor names (``numel(t)``), rendered to Python and
C++ by :mod:`codegen.exprs`.  Messages are ``str.format``-style templates of such
expressions (``{shape(x)}`` prints a tensor's shape).

Order of the checks of a call (every backend and the reference make them in this order, so
they reject a bad call with the same error): each required tensor argument in order (type,
layout, dtype, rank, contiguity, device, shape), the optional read tensors, the int and
float arguments, the ``checks`` in order, the output buffers (``_out`` form) and the written
options, overlap of written and read memory, then the data checks (``data_checks``: they
read tensor values; the binding runs them only where that is free, on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tensor:
    """A tensor argument.  ``dims``: one expression per dimension; a bare name not bound yet
    binds that size variable, anything else is checked against the tensor's size (None: any
    shape).  For outputs and ``buffer`` options the dims are the *needed* size: a 1-D buffer
    needs at least that many elements, a 2-D buffer exactly that many columns and at least
    that many rows."""

    name: str
    dtype: str
    dims: tuple[str, ...] | None
    # dtype: "int32", "float32", "bfloat16", "uint8"; "float": any of float32, float16 and
    # bfloat16 (the kernel gets the dtype_code); "=<tensor>": the dtype of that tensor
    layout: str = ""  # readable shape for messages, e.g. "[M, topk]"
    optional: bool = False  # keyword-only ``Tensor? name=None``
    written: bool = False  # an option the op writes (zero_buf, sorted_scales)
    buffer: bool = False  # a written option with dims: checked like an output buffer
    doc: str = ""

    @property
    def shape_text(self) -> str:
        return self.layout or ("[" + ", ".join(self.dims) + "]" if self.dims else "")


@dataclass(frozen=True)
class Int:
    name: str
    doc: str = ""


@dataclass(frozen=True)
class Code(Int):
    """A keyword-only option that Python takes as a str, a bool or an optional count and the
    schema, the checks and the kernels as an int code: ``kind`` "choice" (a str of
    ``choices``; code: its index), "flag" (a bool; 0 or 1) or "count" (None or an int >= 1;
    code: 0 or the int).  The wrappers and the reference turn the values into codes with
    ``<op>_codes`` of the validators (generated), before any other check."""

    kind: str = "count"
    default: object = None
    choices: tuple[str, ...] = ()

    @property
    def default_code(self) -> int:
        if self.kind == "choice":
            return self.choices.index(self.default)
        return int(self.default) if self.default is not None else 0

    @property
    def py_type(self) -> str:
        return {"choice": "str", "flag": "bool", "count": "int | None"}[self.kind]

    @property
    def code_rule(self) -> tuple[str, str]:
        """(condition, message) of a valid code (the binding's check of the int)."""
        if self.kind == "choice":
            return (f"{self.name} >= 0 and {self.name} < {len(self.choices)}",
                    f"{self.name} must be a code in [0, {len(self.choices) - 1}] "
                    f"({', '.join(self.choices)}), got {{{self.name}}}")  # fmt: skip
        if self.kind == "flag":
            return (f"{self.name} == 0 or {self.name} == 1",
                    f"{self.name} must be 0 or 1, got {{{self.name}}}")  # fmt: skip
        return f"{self.name} >= 0", f"{self.name} must be >= 0 (0: None), got {{{self.name}}}"


@dataclass(frozen=True)
class Float:
    name: str
    default: float = 1.0
    doc: str = ""


@dataclass(frozen=True)
class Rule:
    """``cond`` must hold, else ``error(message)``; ``when``: only if that option is given."""

    cond: str
    message: str
    error: str = "ValueError"
    when: str | None = None


@dataclass(frozen=True)
class Limit:
    """The size variable or int argument ``var`` must satisfy ``limits.LIMITS[limit]``."""

    var: str
    limit: str


@dataclass(frozen=True)
class Size:
    """A derived size variable ``name = expr``."""

    name: str
    expr: str


@dataclass(frozen=True)
class Group:
    """Outputs the Python API passes as one object (``out: MoeSortOutput``)."""

    name: str
    type: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class OpSpec:
    name: str  # the kernels are aiter_aux::cpu::<name> and aiter_aux::gpu::<name>
    op_id: int  # unique, > 0; stored in the lookup next to each key (AiterAuxInstance.op)
    params: tuple[str, ...]  # compile-time parameters: the kernels' template arguments, in order
    key_parts: tuple[str, ...]  # instance key letters, one per param
    struct: str  # the C args struct of mxfp4_moe_aux_abi.h (a new one only adds to the ABI;
    #              changing an existing struct bumps AITER_AUX_ABI_VERSION there)
    # The struct's aggregate initialiser, field by field in declaration order (nested tuples
    # for nested structs; every field, or the binding does not compile): a tensor's name
    # gives its data pointer (NULL when empty or an absent option; const when read), an
    # expression of ints gives the value converted to the field's integer type, a Float
    # argument a float, "0" / "nullptr" a constant, and expert_map_ptr(expert_map) the map
    # (an empty map points at a -1: "every pair non-local").
    fill: tuple
    inputs: tuple = ()  # positional: Tensor / Int / Float
    options: tuple = ()  # keyword-only: optional Tensor / Float
    outputs: tuple[Tensor, ...] = ()
    checks: tuple = ()  # Limit / Size / Rule, in order
    data_checks: tuple[str, ...] = ()  # helper calls that read tensor values
    groups: tuple[Group, ...] = ()
    python_name: str = ""  # the Python function (default: name)
    python_select: tuple[str, str] | None = None  # (argument, value) picking this op
    partial_outputs: bool = False  # rows past num_valid_ids[0] are not written
    summary: str = ""  # docstring of the wrapper of the _out form
    alloc_summary: str = ""  # docstring of the allocating wrapper
    key_doc: str = field(default="", compare=False)
    # Where the op's code lives (the op's registration: the aggregator headers' include
    # lists and the reference package's exports are generated from these):
    # (CPU header under cpu/, GPU header under gpu/).  An instance TU includes only its op's
    # header, so an edit of one op's kernels recompiles only that op's instances.  () for a
    # composed op.
    kernels: tuple[str, ...] = ("", "")
    reference: str = ""  # the module of aiter_aux/reference defining <name>[_out] (py_name)
    # A composed op: ((op, member), ...), other ops of the table run in order by the binding,
    # each on that member of this op's args struct, after every check of this op.  It has no
    # kernels and no instances of its own: a call finds (or builds on demand) each part's
    # instance, whose compile-time parameters are this op's of the same names.
    composes: tuple[tuple[str, str], ...] = ()

    @property
    def py_name(self) -> str:
        return self.python_name or self.name

    def args(self) -> tuple:
        return self.inputs + self.options

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(a for a in self.args() if isinstance(a, Tensor))

    def group_of(self, output: str) -> Group | None:
        return next((g for g in self.groups if output in g.members), None)


MAX_PARAMS = 3  # compile-time parameters of any op (the lookup stores this many values)


# ------------------------------------------------------------------------------ schemas
def _schema_arg(a, mutated: str = "") -> str:
    if isinstance(a, Code):
        return f"int {a.name}={a.default_code}"
    if isinstance(a, Int):
        return f"int {a.name}"
    if isinstance(a, Float):
        return f"float {a.name}={a.default!r}"
    alias = f"({mutated}!)" if mutated else ""
    return f"Tensor{alias}? {a.name}=None" if a.optional else f"Tensor{alias} {a.name}"


def _written_alias(spec: OpSpec, t: Tensor) -> str:
    """The alias letter of a written option (``z`` zero_buf, ``s`` sorted_scales)."""
    return {"zero_buf": "z", "sorted_scales": "s"}.get(t.name, t.name[0])


def schemas(spec: OpSpec) -> tuple[str, str]:
    """The torch schemas ``(allocating, out)`` of ``spec``: ``<name>(inputs, options) ->
    (Tensor, ...)`` and ``<name>_out(inputs, Tensor(a!) out0, ..., options) -> ()``.  The
    options follow the inputs and outputs as positional-or-keyword arguments: the wrappers
    pass options that are not all defaults by position (torch parses a keyword for ~0.4 us,
    a position for a fraction of that); callers may still name them."""
    ins = ", ".join(_schema_arg(a) for a in spec.inputs)
    opts = ", ".join(
        _schema_arg(a, _written_alias(spec, a) if getattr(a, "written", False) else "")
        for a in spec.options
    )
    kw = f", {opts}" if opts else ""
    rets = ", ".join("Tensor" for _ in spec.outputs)
    rets = rets if len(spec.outputs) == 1 else f"({rets})"
    mutated = ", ".join(
        f"Tensor({chr(ord('a') + i)}!) {o.name}" for i, o in enumerate(spec.outputs)
    )
    return f"{spec.name}({ins}{kw}) -> {rets}", f"{spec.name}_out({ins}, {mutated}{kw}) -> ()"


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
    """The C++ function type the binding gives the op of ``schema`` (stable ABI types:
    ``Tensor`` is ``torch::stable::Tensor``), e.g. ``void(const Tensor&, int64_t)``."""
    args = ", ".join(_CPP_TYPES[t] for t, _ in schema_args(schema))
    rets = schema[schema.rindex("->") + 2 :].strip()
    n = 0 if rets == "()" else rets.count("Tensor")
    ret = "void" if n == 0 else "Tensor" if n == 1 else f"std::tuple<{', '.join(['Tensor'] * n)}>"
    return f"{ret}({args})"
