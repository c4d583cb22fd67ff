"""The op table: the one definition of every aux op (stdlib only).

An :class:`OpSpec` says everything about one op that is not its kernels or its reference:
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

from .limits import MAX_ROWS


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

    @property
    def py_name(self) -> str:
        return self.python_name or self.name

    def args(self) -> tuple:
        return self.inputs + self.options

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(a for a in self.args() if isinstance(a, Tensor))

    def group_of(self, output: str) -> Group | None:
        return next((g for g in self.groups if output in g.members), None)


# ------------------------------------------------------------------------- shared parts
ROUTING = (
    Tensor("topk_ids", "int32", ("M", "topk"), doc="the experts of each token, global ids "
           "with an expert_map"),
    Tensor("topk_weights", "float32", ("M", "topk"), doc="the router weight of each pair"),
)  # fmt: skip
SORT_INTS = (
    Int("num_experts", "experts of this rank's instance"),
    Int("block_m", "rows per sorted block"),
)
SORT_OPTIONS = (
    Tensor("zero_buf", "bfloat16", None, optional=True, written=True,
           doc="zeroed (or set to zero_buf_init) in the same call, any shape"),
    Tensor("expert_map", "int32", ("num_global_experts",), optional=True,
           doc="global id -> local expert (expert parallelism)"),
    Tensor("zero_buf_init", "bfloat16", None, optional=True,
           doc="copied into zero_buf instead of zeros"),
)  # fmt: skip
SORT_CHECKS = (
    Rule("zero_buf_init is None or zero_buf is not None",
         "zero_buf_init needs zero_buf (the buffer it is copied into)"),
    Rule("zero_buf_init is None or numel(zero_buf_init) == numel(zero_buf)",
         "zero_buf_init must have the {numel(zero_buf)} elements of zero_buf, "
         "got {numel(zero_buf_init)}"),
    Limit("M", "num_tokens"),
    Limit("topk", "topk"),
    Limit("num_experts", "num_experts"),
    Limit("block_m", "block_m"),
    Size("max_rows", "sort_capacity(M, topk, num_experts, block_m)"),
    Rule(f"max_rows <= {MAX_ROWS}",
         "max_rows = round_up(M*topk + num_experts*(block_m-1), block_m) = {max_rows} must "
         f"fit in int32 (<= {MAX_ROWS}); M={{M}}, topk={{topk}}"),
)  # fmt: skip
SORT_OUTPUTS = (
    Tensor("sorted_token_ids", "int32", ("max_rows",)),
    Tensor("sorted_weights", "float32", ("max_rows",)),
    Tensor("m_indices", "int32", ("max_rows",)),
    Tensor("sorted_expert_ids", "int32", ("max_rows // block_m",)),
    Tensor("num_valid_ids", "int32", ("2",)),
    Tensor("reverse_sorted", "int32", ("M * topk",)),
)
SORT_GROUP = Group("out", "MoeSortOutput", tuple(t.name for t in SORT_OUTPUTS))
SORT_FILL = ("topk_ids", "topk_weights", "M", "num_experts", "topk", "block_m", "0", "max_rows",
             "sorted_token_ids", "sorted_weights", "m_indices", "sorted_expert_ids",
             "num_valid_ids", "reverse_sorted", "zero_buf", "numel(zero_buf)",
             "expert_map_ptr(expert_map)", "numel(expert_map)", "zero_buf_init")  # fmt: skip

X = Tensor("x", "bfloat16", ("M", "model_dim"), doc="the activations, one row per token")
MODEL_DIM_32 = Rule("model_dim > 0 and model_dim % 32 == 0",
                    "model_dim must be a positive multiple of 32, got {model_dim}")  # fmt: skip
QUANT_FILL = ("x", "M", "model_dim", "0", "a_q", "a_scale")


def quant_outputs(fp8: bool) -> tuple[Tensor, Tensor]:
    return (
        Tensor("a_q", "uint8", ("M", "model_dim" if fp8 else "model_dim // 2")),
        Tensor("a_scale", "uint8", ("M", "model_dim // 32")),
    )


SORTED_SCALES = Tensor(
    "sorted_scales", "uint8", ("sort_scales_rows(max_rows, block_m)", "model_dim // 32"),
    optional=True, written=True, buffer=True,
    doc="the decode step's sorted scales, written as moe_sort_scales would",
)  # fmt: skip
SORTED_SCALES_256 = Rule(
    "model_dim % 256 == 0",
    "sorted_scales needs model_dim a multiple of 256 (the layout of moe_sort_scales), "
    "got model_dim = {model_dim}",
    when="sorted_scales",
)
SCATTER_ROUTING = (
    Tensor("reverse_sorted", "int32", ("n_pairs",), "[M*topk]", doc="the row of each pair"),
    Tensor("sorted_weights", "float32", ("n_weights",), "[>= rows]",
           doc="the weight of each row"),
    Int("topk"),
)  # fmt: skip
SCATTER_CHECKS = (
    Limit("topk", "topk"),
    Rule("n_pairs % topk == 0",
         "reverse_sorted length ({n_pairs}) must be M*topk, a multiple of topk = {topk}"),
    Rule("n_weights >= rows",
         "sorted_weights must have >= rows of expert_out = {rows} elements, got {n_weights}"),
    Size("M", "n_pairs // topk"),
)  # fmt: skip
SCALE = Float("routed_scaling_factor", 1.0, "multiplies each token's fp32 sum")
SCATTER_OUT = (Tensor("out", "bfloat16", ("M", "model_dim")),)
SCATTER_DATA = ("rows_in_range(reverse_sorted, rows)",)

_SORT_DOC = """Sort the token->expert pairs by expert into block_m-padded segments, into ``out``
(a :class:`MoeSortOutput` of preallocated buffers); semantics, shapes and errors as
:func:`aiter_aux.reference.moe_sort_out`.  ``zero_buf`` (bf16, any shape) is zeroed in the
same call, or set to ``zero_buf_init``; with ``expert_map`` (int32 ``[num_global_experts]``,
expert parallelism) ``topk_ids`` hold global ids and a pair's expert is
``expert_map[id]`` (not local when < 0 or >= num_experts).  Rows past
``num_valid_ids[0]`` are not written."""
_QUANT_DOC = """Quantise bf16 ``x`` [M, model_dim] to MXFP4 per_1x32 (OCP Microscaling Formats
v1.0) into ``a_q`` uint8 [M, model_dim/2] (e2m1, element 2j in the low nibble of byte j)
and ``a_scale`` uint8 [M, model_dim/32] (e8m0), as :func:`aiter_aux.reference.mxfp4_quant`."""
_QUANT8_DOC = """Quantise bf16 ``x`` [M, model_dim] to MXFP8 per_1x32 into ``a_q`` uint8
[M, model_dim] (e4m3 bytes; ``a_q.view(torch.float8_e4m3fn)``) and ``a_scale`` uint8
[M, model_dim/32] (e8m0), as :func:`aiter_aux.reference.mxfp8_quant`."""
_SORT_QUANT_DOC = """:func:`moe_sort_out` and :func:`mxfp4_quant_out` (``quant_dtype="mxfp8"``:
:func:`mxfp8_quant_out`) in one call (one launch on GPU); outputs identical to the separate
ops.  ``sorted_scales`` (optional; the decode step in one call): uint8 2-D
``[>= out_rows, model_dim / 32]`` with ``out_rows = ceil(max_rows / BM) * BM``,
``BM = max(32, block_m)`` and ``model_dim % 256 == 0``, written exactly as
``moe_sort_scales_out(a_scale, out.sorted_token_ids, out.num_valid_ids, block_m,
sorted_scales)`` would (see :func:`aiter_aux.reference.moe_sort_quant_out`)."""
_SCALES_DOC = """Shuffle ``a_scale`` uint8 [M, model_dim/32] (e8m0) into the grouped GEMM's scale
layout, rows in the order of the sort, into ``sorted_scales`` uint8
[ceil(max_rows/BM)*BM, model_dim/32] with BM = max(32, block_m); every byte of those rows
is written (see :func:`aiter_aux.reference.moe_sort_scales`)."""
_SCATTER_DOC = """Weighted top-k reduce of ``expert_out`` bf16 [rows, model_dim] (sorted order)
back to tokens: ``out`` bf16 [M, model_dim], M = reverse_sorted.numel() // topk (see
:func:`aiter_aux.reference.moe_scatter_reduce`).  The fp32 sum is multiplied by
``routed_scaling_factor`` (fp32) before the bf16 rounding.  On the CPU a row index >= rows
raises ``ValueError``; on the GPU it is not read (checking would synchronise)."""
_SCATTER_Q_DOC = """:func:`moe_scatter_reduce_out` with MXFP4 ``expert_out``: e2m1
``expert_out_q`` uint8 [rows, model_dim/2] and e8m0 ``expert_out_scale`` uint8
[rows, model_dim/32] (scale 255 decodes to NaN)."""


_SUM_DOC = """Sum of each token's ``topk`` rows: ``output[t] = round(fp32(acc) *
routed_scaling_factor)``, ``acc`` the fp32 sum of ``input[t, k]`` in k order from +0.0, one
rounding to the dtype of ``input`` (float32, float16 or bfloat16; RNE, a NaN written as
0x7FFF / 0x7FFFFFFF).  With ``topk_ids`` (int32 ``[M, topk]``) a slot whose id is < 0 is
skipped; with ``expert_map`` too, also one whose id is >= ``expert_map.numel()`` or whose
``expert_map`` entry is < 0 (see :func:`aiter_aux.reference.moe_sum_out`).  ``output``
needs ``model_dim`` columns and >= M rows; the first M are written."""


def _sort_quant(name: str, op_id: int, fp8: bool) -> OpSpec:
    return OpSpec(
        name, op_id, ("num_experts", "topk", "model_dim"), ("e", "k", "d"),
        "AiterAuxSortQuantArgs", (SORT_FILL, QUANT_FILL, "sorted_scales"),
        inputs=ROUTING + (X,) + SORT_INTS,
        options=SORT_OPTIONS + (SORTED_SCALES,),
        outputs=SORT_OUTPUTS + quant_outputs(fp8),
        checks=(MODEL_DIM_32,) + SORT_CHECKS + (SORTED_SCALES_256,),
        groups=(SORT_GROUP,),
        partial_outputs=True,
        python_name="moe_sort_quant",
        python_select=("quant_dtype", "mxfp8" if fp8 else "mxfp4"),
        summary=_SORT_QUANT_DOC,
        alloc_summary="Allocating :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, "
        "a_scale)``; ``zero_buf`` and ``sorted_scales`` are the caller's buffers (written, "
        "not returned).",
    )  # fmt: skip


_ALIGN_DOC = """{peer}'s ``moe_align_block_size`` format, written by our sort kernels in one
launch (three on the large path): the pairs ``i = t * topk + k`` sorted by {bucket} into
``block_size``-padded segments, ascending ``i`` inside a segment (deterministic), into
``sorted_token_ids`` (``i``; padding and every row past the total hold ``M * topk``),
``expert_ids`` (per block; -1 past the used blocks{labels}), ``num_tokens_post_pad`` [1] and
``scatter_idx`` [M * topk] (``i`` for a pair that takes part, else -1).  Written: rows
``[0, cap)``, ``cap = min(len(sorted_token_ids), len(expert_ids) * block_size)``, and blocks
``[0, ceil(cap / block_size))``.  Semantics as
:func:`aiter_aux.reference.{ref}` (the formats of :mod:`aiter_aux.reference.compat`); the
drop-in is :func:`aiter_aux.compat.{mod}.moe_align_block_size`."""
ALIGN_INTS = (Int("num_experts", "experts (vLLM: global with a map)"),
              Int("block_size", "rows per block (16, 32, 64 or 128)"))  # fmt: skip
ALIGN_IDS = Tensor("topk_ids", "int32", ("M", "topk"),
                   doc="the experts of each token (only the flat pairs matter)")  # fmt: skip


def _align_checks(capacity: str, peer_limit: Rule | None) -> tuple:
    return (
        Limit("M", "num_tokens"),
        Limit("num_experts", "num_experts"),
        Limit("block_size", "block_m"),
    ) + ((peer_limit,) if peer_limit else ()) + (
        Size("cap", f"{capacity}(M * topk, num_experts, block_size)"),
        Rule(f"cap <= {MAX_ROWS} - 65536",
             "sorted_token_ids capacity {cap} must fit in int32 with 2**16 to spare; "
             "M={M}, topk={topk}"),
        Size("n_blocks", "(cap + block_size - 1) // block_size"),
    )  # fmt: skip


def _align_outputs() -> tuple[Tensor, ...]:
    return (
        Tensor("sorted_token_ids", "int32", ("cap",), doc="every element written"),
        Tensor("expert_ids", "int32", ("n_blocks",), doc="every element written"),
        Tensor("num_tokens_post_pad", "int32", ("1",)),
        Tensor("scatter_idx", "int32", ("M * topk",), doc="i, or -1 for a dropped pair"),
    )


def _align_fill(expert_map: str, n_global: str, labels: str, n_labels: str) -> tuple:
    return ("topk_ids", "M * topk", "num_experts", "block_size",
            "min(numel(sorted_token_ids), numel(expert_ids) * block_size)",
            "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "scatter_idx",
            expert_map, n_global, labels, n_labels)  # fmt: skip


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "moe_sort", 1, ("num_experts", "topk"), ("e", "k"), "AiterAuxSortArgs", SORT_FILL,
            inputs=ROUTING + SORT_INTS, options=SORT_OPTIONS, outputs=SORT_OUTPUTS,
            checks=SORT_CHECKS, groups=(SORT_GROUP,), partial_outputs=True, summary=_SORT_DOC,
            alloc_summary="Allocating :func:`moe_sort_out`: a :class:`MoeSortOutput` of "
            "capacity ``moe_sort_capacity(M, topk, num_experts, block_m)``.",
        ),
        OpSpec(
            "mxfp4_quant", 2, ("model_dim",), ("d",), "AiterAuxQuantArgs", QUANT_FILL,
            inputs=(X,), outputs=quant_outputs(False), checks=(MODEL_DIM_32,),
            summary=_QUANT_DOC, alloc_summary="Allocating :func:`mxfp4_quant_out`.",
        ),
        _sort_quant("moe_sort_quant", 3, fp8=False),
        OpSpec(
            "moe_sort_scales", 4, ("model_dim",), ("d",), "AiterAuxSortScalesArgs",
            ("a_scale", "M", "model_dim", "block_m", "sorted_token_ids", "num_valid_ids",
             "max_rows", "sorted_scales"),
            inputs=(Tensor("a_scale", "uint8", ("M", "scale_cols"), "[M, model_dim/32]"),
                    Tensor("sorted_token_ids", "int32", ("max_rows",)),
                    Tensor("num_valid_ids", "int32", ("n_valid",), "[2]"),
                    Int("block_m")),
            outputs=(Tensor("sorted_scales", "uint8", ("out_rows", "scale_cols")),),
            checks=(
                Rule("n_valid >= 2", "num_valid_ids must have 2 elements, got {n_valid}"),
                Limit("block_m", "block_m"),
                Rule("scale_cols > 0 and scale_cols % 8 == 0",
                     "a_scale must have model_dim/32 columns with model_dim a positive "
                     "multiple of 256, got {scale_cols} columns (model_dim = "
                     "{scale_cols * 32})"),
                Rule("max_rows % block_m == 0",
                     "sorted_token_ids length (max_rows = {max_rows}) must be a multiple of "
                     "block_m = {block_m}"),
                Size("model_dim", "scale_cols * 32"),
                Size("out_rows", "sort_scales_rows(max_rows, block_m)"),
            ),
            summary=_SCALES_DOC, alloc_summary="Allocating :func:`moe_sort_scales_out`.",
        ),
        OpSpec(
            "moe_scatter_reduce", 5, ("model_dim", "topk"), ("d", "k"), "AiterAuxScatterArgs",
            ("expert_out", "nullptr", "nullptr", "rows", "reverse_sorted", "sorted_weights", "M",
             "model_dim", "topk", "out", "routed_scaling_factor", "0"),
            inputs=(Tensor("expert_out", "bfloat16", ("rows", "model_dim"),
                           doc="the experts' output rows, in sorted order"),)
            + SCATTER_ROUTING,
            options=(SCALE,), outputs=SCATTER_OUT,
            checks=(Rule("model_dim >= 1", "expert_out must have model_dim >= 1 columns, got 0"),)
            + SCATTER_CHECKS,
            data_checks=SCATTER_DATA, summary=_SCATTER_DOC,
            alloc_summary="Allocating :func:`moe_scatter_reduce_out`.",
        ),
        OpSpec(
            "moe_scatter_reduce_q", 6, ("model_dim", "topk"), ("d", "k"), "AiterAuxScatterArgs",
            ("nullptr", "expert_out_q", "expert_out_scale", "rows", "reverse_sorted",
             "sorted_weights", "M", "model_dim", "topk", "out", "routed_scaling_factor", "0"),
            inputs=(Tensor("expert_out_q", "uint8", ("rows_q", "q_cols"), "[rows, model_dim/2]"),
                    Tensor("expert_out_scale", "uint8", ("rows", "scale_cols"),
                           "[rows, model_dim/32]"))
            + SCATTER_ROUTING,
            options=(SCALE,), outputs=SCATTER_OUT,
            checks=(
                Rule("scale_cols >= 1",
                     "expert_out_scale must have model_dim/32 >= 1 columns, got 0"),
                Rule("rows_q == rows and q_cols == 16 * scale_cols",
                     "expert_out_q must have shape [rows, model_dim/2] = [{rows}, "
                     "{16 * scale_cols}] to match expert_out_scale {shape(expert_out_scale)}, "
                     "got {shape(expert_out_q)}"),
                Size("model_dim", "32 * scale_cols"),
            ) + SCATTER_CHECKS,
            data_checks=SCATTER_DATA, summary=_SCATTER_Q_DOC,
            alloc_summary="Allocating :func:`moe_scatter_reduce_q_out`.",
        ),
        OpSpec(
            "mxfp8_quant", 7, ("model_dim",), ("d",), "AiterAuxQuantArgs", QUANT_FILL,
            inputs=(X,), outputs=quant_outputs(True), checks=(MODEL_DIM_32,),
            summary=_QUANT8_DOC, alloc_summary="Allocating :func:`mxfp8_quant_out`.",
        ),
        _sort_quant("moe_sort_quant_fp8", 8, fp8=True),
        OpSpec(
            "moe_sum", 9, (), (), "AiterAuxSumArgs",
            ("input", "M", "model_dim", "topk", "dtype_code(input)", "routed_scaling_factor",
             "topk_ids", "expert_map_ptr(expert_map)", "numel(expert_map)", "output"),
            inputs=(Tensor("input", "float", ("M", "topk", "model_dim"),
                           doc="each token's topk rows: float32, float16 or bfloat16"),),
            options=(Tensor("topk_ids", "int32", ("M", "topk"), optional=True,
                            doc="each slot's expert (global id with expert_map); < 0: skipped"),
                     Tensor("expert_map", "int32", ("num_global_experts",), optional=True,
                            doc="global id -> local expert; a slot whose id is past the map "
                            "or maps to < 0 is skipped"),
                     SCALE),
            outputs=(Tensor("output", "=input", ("M", "model_dim")),),
            checks=(
                Rule("topk >= 1", "input must have topk >= 1 rows per token (its dim 1), got 0"),
                Rule("size(topk_ids, 0) == M and size(topk_ids, 1) == topk",
                     "topk_ids must have shape [M, topk] = [{M}, {topk}], got "
                     "{shape(topk_ids)}", when="topk_ids"),
                Rule("expert_map is None or topk_ids is not None",
                     "expert_map needs topk_ids (the ids it maps)"),
            ),
            summary=_SUM_DOC, alloc_summary="Allocating :func:`moe_sum_out`.",
        ),
        OpSpec(
            "moe_align_block_size_vllm", 11, ("num_experts",), ("e",), "AiterAuxAlignArgs",
            _align_fill("expert_map_ptr(expert_map)", "num_experts", "block_expert_map",
                        "numel(block_expert_map)"),
            inputs=(ALIGN_IDS,) + ALIGN_INTS,
            options=(
                Tensor("expert_map", "int32", ("n_map",), optional=True,
                       doc="vLLM's expert_map with ignore_invalid_experts: sort by "
                       "expert_map[id], drop -1"),
                Tensor("block_expert_map", "int32", ("n_label",), optional=True,
                       doc="vLLM's expert_map without ignore_invalid_experts: expert_ids = "
                       "block_expert_map[expert_ids]"),
            ),
            outputs=_align_outputs(),
            checks=_align_checks("vllm_align_capacity", None) + (
                Rule("expert_map is None or block_expert_map is None",
                     "give expert_map (ignore_invalid_experts) or block_expert_map, not both"),
                Rule("numel(expert_map) >= num_experts",
                     "expert_map must have >= num_experts ({num_experts}) entries, got "
                     "{numel(expert_map)}",
                     when="expert_map"),
                Rule("numel(block_expert_map) >= num_experts",
                     "block_expert_map must have >= num_experts ({num_experts}) entries, got "
                     "{numel(block_expert_map)}", when="block_expert_map"),
            ),
            summary=_ALIGN_DOC.format(
                peer="vLLM", bucket="expert (``expert_map[id]`` with ``expert_map``)",
                labels="; with ``block_expert_map`` the blocks hold ``block_expert_map[e]`` "
                "and the later ones its last entry", ref="moe_align_block_size_vllm_out",
                mod="vllm"),
            alloc_summary="Allocating :func:`moe_align_block_size_vllm_out` (capacity "
            "without ``pad_sorted_ids``).",
        ),
        OpSpec(
            "moe_align_block_size_sglang", 12, ("num_experts",), ("e",), "AiterAuxAlignArgs",
            _align_fill("nullptr", "0", "nullptr", "0"),
            inputs=(ALIGN_IDS,) + ALIGN_INTS,
            outputs=_align_outputs(),
            checks=_align_checks(
                "sglang_align_capacity",
                Rule("num_experts <= 1023",
                     "num_experts must be <= 1023 (num_experts + 1 buckets), got {num_experts}"),
            ),
            summary=_ALIGN_DOC.format(
                peer="SGLang", bucket="``id + 1`` (bucket 0: id -1, first, labelled -1)",
                labels="", ref="moe_align_block_size_sglang_out", mod="sglang"),
            alloc_summary="Allocating :func:`moe_align_block_size_sglang_out`.",
        ),
    )
}  # fmt: skip

MAX_PARAMS = 3  # compile-time parameters of any op (the lookup stores this many values)


# ------------------------------------------------------------------------------ schemas
def _schema_arg(a, mutated: str = "") -> str:
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
    """The torch schemas ``(allocating, out)`` of ``spec``: ``<name>(inputs, *, options) ->
    (Tensor, ...)`` and ``<name>_out(inputs, Tensor(a!) out0, ..., *, options) -> ()``."""
    ins = ", ".join(_schema_arg(a) for a in spec.inputs)
    opts = ", ".join(
        _schema_arg(a, _written_alias(spec, a) if getattr(a, "written", False) else "")
        for a in spec.options
    )
    kw = f", *, {opts}" if opts else ""
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
