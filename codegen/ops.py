"""The op table: the one definition of every aux op (stdlib only).

Each entry is an :class:`~codegen.opspec.OpSpec` (what its fields mean, and what is generated
from them: :mod:`codegen.opspec`).  Adding an op: its entry here, its args struct in
``csrc/kernels/mxfp4_moe/mxfp4_moe_aux_abi.h``, its CPU and GPU kernels (the headers named by
``kernels``), its reference (the module named by ``reference``) and its case builder
(``make_case`` in ``op_tests/fuzz_cases.py``); then ``python codegen/gen_sources.py``.
"""

from __future__ import annotations

from .limits import MAX_ROWS, MX_MODEL_DIM, NUM_EXPERTS, NUM_TOKENS, SCALES_MODEL_DIM
from .opspec import Code, Float, Group, Int, Limit, OpSpec, Rule, Size, Tensor

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
MODEL_DIM_32 = Rule(f"model_dim > 0 and model_dim % {MX_MODEL_DIM.of} == 0",
                    f"model_dim must be a positive multiple of {MX_MODEL_DIM.of}, "
                    "got {model_dim}")  # fmt: skip
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
    f"model_dim % {SCALES_MODEL_DIM.of} == 0",
    f"sorted_scales needs model_dim a multiple of {SCALES_MODEL_DIM.of} (the layout of "
    "moe_sort_scales), got model_dim = {model_dim}",
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


_ROUTE_DOC = """The top-k gate of each token: ``topk_ids`` int32 ``[M, topk]`` = the ``topk``
experts of largest ``choice`` (descending, ties to the lower id, NaN last) and
``topk_weights`` float32 ``[M, topk]`` = their ``scores``.  ``scores`` = softmax over the row
(``scoring="softmax"``) or sigmoid (``"sigmoid"``) of ``router_logits`` (float32, float16 or
bfloat16 ``[M, E]``, E <= 1024) in fp32, or the logits themselves (``"none"``);
``choice = scores + correction_bias`` (float32 ``[E]``) when given, else ``scores``.  With
``num_expert_group`` G and ``topk_group``, only the experts of the ``topk_group`` best
groups of E / G consecutive ids are chosen (a group's score: the sum of its two largest
``choice`` with a bias, else its largest score).  The weights are divided by their fp32 sum
when ``renormalize``, then multiplied by ``routed_scaling_factor``.  Bytes as
:func:`aiter_aux.reference.moe_route_out` (docs/ops.md); the outputs need ``topk`` columns
and >= M rows; the first M are written."""
ROUTER_LOGITS = Tensor(
    "router_logits", "float", ("M", "E"), doc="the router's logits: float32, float16 or bfloat16"
)
ROUTE_OPTIONS = (
    Code("scoring", "softmax or sigmoid of the logits, or none (they are the scores)",
         kind="choice", default="softmax", choices=("softmax", "sigmoid", "none")),
    Code("renormalize", "divide the weights by their sum", kind="flag", default=True),
    Code("num_expert_group", "groups of consecutive experts (None: no groups)"),
    Code("topk_group", "groups kept (with num_expert_group)"),
    Tensor("correction_bias", "float32", ("E",), optional=True,
           doc="added to the scores for the choice only"),
    SCALE,
)  # fmt: skip
ROUTE_CHECKS = (
    Limit("M", "num_tokens"),
    Limit("E", "route_experts"),
    Limit("topk", "route_topk"),
    Rule("topk <= E", "topk must be <= E = {E} (the experts of router_logits), got {topk}"),
    Rule("numel(correction_bias) == E",
         "correction_bias must have shape [E] = [{E}], got {shape(correction_bias)}",
         when="correction_bias"),
    Rule("(num_expert_group == 0) == (topk_group == 0)",
         "num_expert_group and topk_group must both be given or both be None"),
    Rule("num_expert_group == 0 or E % num_expert_group == 0",
         "num_expert_group = {num_expert_group} must divide E = {E} (the experts of "
         "router_logits)"),
    Rule("topk_group <= num_expert_group",
         "topk_group must be <= num_expert_group = {num_expert_group}, got {topk_group}"),
    Rule("num_expert_group == 0 or topk <= topk_group * (E // num_expert_group)",
         "topk = {topk} must be <= the experts of the kept groups, topk_group * E / "
         "num_expert_group = {topk_group * (E // num_expert_group)}"),
)  # fmt: skip
ROUTE_OUTPUTS = (
    Tensor("topk_weights", "float32", ("M", "topk")),
    Tensor("topk_ids", "int32", ("M", "topk")),
)
ROUTE_FILL = ("router_logits", "M", "E", "topk", "dtype_code(router_logits)", "scoring",
              "renormalize", "num_expert_group", "topk_group", "routed_scaling_factor",
              "correction_bias", "topk_weights", "topk_ids")  # fmt: skip
# moe_route's own written option: vLLM's topk_softmax fills it in the same launch
TOKEN_EXPERT_INDICES = Tensor(
    "token_expert_indices", "int32", ("M", "topk"), optional=True, written=True, buffer=True,
    doc="written k * M + t for output (t, k) (vLLM's token_expert_indices)",
)  # fmt: skip


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
        kernels=("mxfp8_cpu.h" if fp8 else "core_cpu.h", "sort.h"),
        reference="quant",
        summary=_SORT_QUANT_DOC,
        alloc_summary="Allocating :func:`moe_sort_quant_out`: returns ``(MoeSortOutput, a_q, "
        "a_scale)``; ``zero_buf`` and ``sorted_scales`` are the caller's buffers (written, "
        "not returned).",
    )  # fmt: skip


_ROUTE_SORT_QUANT_DOC = """The routing preamble from router logits in one call:
:func:`moe_route_out` of ``router_logits`` into ``topk_weights`` and ``topk_ids``, then
:func:`moe_sort_quant_out` of them with ``x`` (``quant_dtype`` "mxfp4" or "mxfp8"); every
output byte for byte those of the two calls, every argument of both checked before anything
is written (the tensors first, then the route's rules, then the sort's).  ``num_experts`` is
the sort's (the local experts with an ``expert_map``); the route's E is
``router_logits.shape[1]``."""


def _route_sort_quant(name: str, op_id: int, fp8: bool) -> OpSpec:
    sort_op = "moe_sort_quant_fp8" if fp8 else "moe_sort_quant"
    # the route's rules bound M and topk already (its topk limit is the stricter)
    implied = (Limit("M", "num_tokens"), Limit("topk", "topk"))
    sort_checks = tuple(c for c in SORT_CHECKS if c not in implied)
    return OpSpec(
        name, op_id, ("num_experts", "topk", "model_dim"), ("e", "k", "d"),
        "AiterAuxRouteSortQuantArgs",
        (ROUTE_FILL + ("nullptr",), (SORT_FILL, QUANT_FILL, "sorted_scales")),
        inputs=(ROUTER_LOGITS, X, Int("topk", "experts per token")) + SORT_INTS,
        options=ROUTE_OPTIONS + SORT_OPTIONS + (SORTED_SCALES,),
        outputs=ROUTE_OUTPUTS + SORT_OUTPUTS + quant_outputs(fp8),
        checks=ROUTE_CHECKS + (MODEL_DIM_32,) + sort_checks + (SORTED_SCALES_256,),
        groups=(SORT_GROUP,),
        partial_outputs=True,
        python_name="moe_route_sort_quant",
        python_select=("quant_dtype", "mxfp8" if fp8 else "mxfp4"),
        kernels=(),
        reference="route_sort_quant",
        composes=(("moe_route", "route"), (sort_op, "sort_quant")),
        summary=_ROUTE_SORT_QUANT_DOC,
        alloc_summary="Allocating :func:`moe_route_sort_quant_out`: returns ``(topk_weights, "
        "topk_ids, MoeSortOutput, a_q, a_scale)``; ``zero_buf`` and ``sorted_scales`` are the "
        "caller's buffers (written, not returned).",
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
              Int("block_size", "rows per block, any size in [1, 65536]"))  # fmt: skip
ALIGN_IDS = Tensor("topk_ids", "int32", ("M", "topk"),
                   doc="the experts of each token (only the flat pairs matter)")  # fmt: skip


def _align_checks(capacity: str, peer_limit: Rule | None) -> tuple:
    return (
        Limit("M", "num_tokens"),
        Rule(f"M * topk < {NUM_TOKENS.hi}",
             f"topk_ids must have < 2**{NUM_TOKENS.hi.bit_length() - 1} elements (a pair's "
             "index is packed in 24 bits), got {M * topk}: M={M}, topk={topk}"),
        Limit("num_experts", "num_experts"),
        Limit("block_size", "align_block_size"),
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
            kernels=("core_cpu.h", "sort.h"), reference="sort",
            alloc_summary="Allocating :func:`moe_sort_out`: a :class:`MoeSortOutput` of "
            "capacity ``moe_sort_capacity(M, topk, num_experts, block_m)``.",
        ),
        OpSpec(
            "mxfp4_quant", 2, ("model_dim",), ("d",), "AiterAuxQuantArgs", QUANT_FILL,
            inputs=(X,), outputs=quant_outputs(False), checks=(MODEL_DIM_32,),
            summary=_QUANT_DOC, alloc_summary="Allocating :func:`mxfp4_quant_out`.",
            kernels=("core_cpu.h", "quant.h"), reference="quant",
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
                Rule(f"scale_cols > 0 and scale_cols % {SCALES_MODEL_DIM.of // 32} == 0",
                     "a_scale must have model_dim/32 columns with model_dim a positive "
                     f"multiple of {SCALES_MODEL_DIM.of}, got {{scale_cols}} columns "
                     "(model_dim = {scale_cols * 32})"),
                Rule("max_rows % block_m == 0",
                     "sorted_token_ids length (max_rows = {max_rows}) must be a multiple of "
                     "block_m = {block_m}"),
                Size("model_dim", "scale_cols * 32"),
                Size("out_rows", "sort_scales_rows(max_rows, block_m)"),
            ),
            summary=_SCALES_DOC, alloc_summary="Allocating :func:`moe_sort_scales_out`.",
            kernels=("core_cpu.h", "sort_scales.h"), reference="sort_scales",
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
            kernels=("core_cpu.h", "scatter.h"), reference="scatter",
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
            kernels=("core_cpu.h", "scatter.h"), reference="scatter",
        ),
        OpSpec(
            "mxfp8_quant", 7, ("model_dim",), ("d",), "AiterAuxQuantArgs", QUANT_FILL,
            inputs=(X,), outputs=quant_outputs(True), checks=(MODEL_DIM_32,),
            summary=_QUANT8_DOC, alloc_summary="Allocating :func:`mxfp8_quant_out`.",
            kernels=("mxfp8_cpu.h", "quant.h"), reference="quant",
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
            kernels=("sums_cpu.h", "sums.h"), reference="sums",
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
            kernels=("align_cpu.h", "align.h"), reference="align",
        ),
        OpSpec(
            "moe_align_block_size_sglang", 12, ("num_experts",), ("e",), "AiterAuxAlignArgs",
            _align_fill("nullptr", "0", "nullptr", "0"),
            inputs=(ALIGN_IDS,) + ALIGN_INTS,
            outputs=_align_outputs(),
            checks=_align_checks(
                "sglang_align_capacity",
                Rule(f"num_experts <= {NUM_EXPERTS.hi - 1}",
                     f"num_experts must be <= {NUM_EXPERTS.hi - 1} (num_experts + 1 buckets), "
                     "got {num_experts}"),
            ),
            summary=_ALIGN_DOC.format(
                peer="SGLang", bucket="``id + 1`` (bucket 0: id -1, first, labelled -1)",
                labels="", ref="moe_align_block_size_sglang_out", mod="sglang"),
            alloc_summary="Allocating :func:`moe_align_block_size_sglang_out`.",
            kernels=("align_cpu.h", "align.h"), reference="align",
        ),
        OpSpec(
            "moe_route", 13, (), (), "AiterAuxRouteArgs",
            ROUTE_FILL + ("token_expert_indices",),
            inputs=(ROUTER_LOGITS, Int("topk", "experts per token")),
            options=ROUTE_OPTIONS + (TOKEN_EXPERT_INDICES,), outputs=ROUTE_OUTPUTS,
            checks=ROUTE_CHECKS,
            summary=_ROUTE_DOC, alloc_summary="Allocating :func:`moe_route_out`: returns "
            "``(topk_weights, topk_ids)``.",
            kernels=("route_cpu.h", "route.h"), reference="route",
        ),
        _route_sort_quant("moe_route_sort_quant", 14, fp8=False),
        _route_sort_quant("moe_route_sort_quant_fp8", 15, fp8=True),
    )
}  # fmt: skip
