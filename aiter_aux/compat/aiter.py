"""AITER's ``aiter/ops/moe_mxfp4_aux.py`` API on aiter-aux's ops: switch by changing an import.

::

    # from aiter.ops.moe_mxfp4_aux import mxfp4_moe_sort, mxfp4_moe_scatter_reduce, ...
    from aiter_aux.compat.aiter import mxfp4_moe_sort, mxfp4_moe_scatter_reduce, ...

Every function has the name, argument order, defaults and argument meaning of AITER's (the
``@compile_ops("module_moe_mxfp4_aux")`` stubs, host code
``csrc/kernels/mxfp4_moe/moe_mxfp4_aux.cu``, kernels ``moe_aux/*.cuh``; docs/compat.md
names the versions read), writes into the caller's buffers and returns ``None``.  Each is a
thin adapter onto an ``_out`` op of :mod:`aiter_aux.ops.aux_ops`: ``cumsum_tensor`` is our
``num_valid_ids``, ``MB`` our ``block_m``, ``NE`` our ``num_experts``, ``TOPK`` our
``topk``, ``D_HIDDEN`` our ``model_dim`` (docs/compat.md has the full table).  Importing
this module builds and loads nothing; the first call loads (or builds) the compiled module.

Checks.  AITER's host code takes raw pointers and checks nothing but the instance key.  The
adapters check that ``NE``/``TOPK``/``D_HIDDEN``/``MB`` are in range (``NE`` in [1, 1024],
``TOPK`` in [1, 255], ``MB`` in {16, 32, 64, 128}, ``D_HIDDEN`` a positive multiple of 32)
and agree with the tensors that carry them (``topk_ids.shape[1] == TOPK``,
``a_input.shape[1] == D_HIDDEN``, ``a_scale.shape[1] == D_HIDDEN / 32``, ``out.shape[1] ==
D_HIDDEN``, ...), that every buffer holds what AITER's kernel would write or read, and that
no written buffer overlaps another buffer; a mismatch raises ``ValueError`` (a wrong dtype
or a non-tensor ``TypeError``) naming AITER's argument, before anything is written.  Then
our op validates again in C++ (its messages name our arguments, see docs/compat.md) and
raises ``ValueError``/``TypeError``, or ``UnsupportedShapeError`` (a ``ValueError``) where no
instance serves the shape; AITER raises ``RuntimeError`` from ``AITER_CHECK`` there.

Where the behaviour differs from AITER's (what AITER does is read from its source, not run:
no gfx950 was at hand):

1. **Order within an expert.**  AITER places an expert's pairs in the order of its atomic
   counters (run-to-run nondeterministic); ours in ascending ``(t, k)`` order, every run.
   So ``sorted_token_ids``, ``sorted_weights``, ``m_indices`` (and the rows in
   ``reverse_sorted``) are a permutation of AITER's within each expert's segment;
   ``sorted_expert_ids``, ``cumsum_tensor``, the segment bounds, the padding and the set of
   pairs per expert are the same.  AITER's own test compares each expert's pairs as a set.
2. **Non-local ids.**  The same: an id outside [0, NE) (``-1`` from vLLM's padding, or out
   of range) is dropped and its ``reverse_sorted`` entry is ``-1``; the scatter adds nothing
   for it.  Our ``expert_map`` (expert parallelism) and ``routed_scaling_factor`` are not in
   AITER's signatures: call :mod:`aiter_aux.ops` (``moe_sort_out``,
   ``moe_scatter_reduce_out``, ...) for them.  Our ``zero_buf_init`` is AITER's
   ``bf16_out_init`` (item 5).
3. **Padding values.**  The same: sorted rows ``M`` (``t = M, k = 0``), ``m_indices`` ``M``,
   ``sorted_weights`` ``0.0``; rows and blocks at or past ``cumsum_tensor[0]`` are not
   written; ``cumsum_tensor = [rows, M]``.
4. **Sort capacity.**  AITER's callers (``fused_moe._adaptive_moe_sort``) size
   ``sorted_token_ids``, ``sorted_weights``, ``m_indices`` as ``round_up(M*TOPK +
   min(NE, M*TOPK)*(MB-1), MB)`` and ``sorted_expert_ids`` as that over MB; our ops
   require ``moe_sort_capacity(M, TOPK, NE, MB) = round_up(M*TOPK + NE*(MB-1), MB)``, more
   when ``M*TOPK < NE`` (decode).  Both bound the rows used.  Buffers of at least our
   capacity are used directly; buffers of at least AITER's size are staged: the op runs on
   scratch buffers of our capacity that start as copies of the caller's, and the caller's
   length is copied back (same bytes, no host sync, but an allocation and two copies per
   short buffer; allocate ``moe_sort_capacity`` to avoid it).  Anything shorter raises
   ``ValueError``.
5. **``bf16_zero_out``** (``numel() == 0`` means none, as in AITER): the first
   ``M * D_HIDDEN`` elements are zeroed, as AITER's kernel does (any 2-byte dtype: AITER
   zeroes bytes; ``_adaptive_moe_sort`` may pass an fp16 ``moe_buf``); fewer elements raise
   ``ValueError``.  In ``mxfp4_moe_sort``/``mxfp4_moe_sort_quant`` it is zeroed in the op's
   own call; ``mxfp4_moe_quant`` zeroes it with a separate ``torch.Tensor.zero_`` (one more
   launch on a GPU; AITER's quant kernel does it in the same launch).  **``bf16_out_init``**
   (None or ``numel() == 0`` means zeros, as in AITER): those ``M * D_HIDDEN`` elements are
   copied from its first ``M * D_HIDDEN``, bit for bit, instead of zeroed (our
   ``zero_buf_init``; ``mxfp4_moe_quant``: a separate ``copy_``); it is ignored wherever
   ``bf16_zero_out`` is not initialised (empty, or ``prologue == 1``), as in AITER.  AITER
   reads it unchecked; the adapters require ``bf16_zero_out``'s dtype (else ``TypeError``),
   contiguity, >= ``M * D_HIDDEN`` elements, its device, and no byte shared with a written
   buffer (``ValueError``; so it cannot be ``bf16_zero_out`` itself, a no-op in AITER).
6. **``prologue``** (``mxfp4_moe_sort``): AITER runs its one-CTA sort for 0 (zeroing
   ``bf16_zero_out`` and ``bf16_zero_workspace``) and its three-stage sort for 1, which
   ignores ``bf16_zero_out`` and the workspace; ours is one sort whose outputs do not depend
   on it, and the adapter zeroes exactly what AITER zeroes: nothing for 1.  AITER treats any
   value other than 1 as 0; the adapter raises ``ValueError`` for values other than 0 and 1.
   **``sort3stage_ws``** (after ``bf16_zero_workspace``, positional or keyword, as in
   AITER) is the three-stage sort's scratch; AITER checks ``numel() >= NE*16 + NE`` for
   ``prologue == 1`` and ignores it for 0, and so does the adapter (which also requires
   int32, the type AITER's kernel uses it as: ``TypeError``).  Our sort needs no scratch: it
   is never read or written here (AITER leaves it clobbered).
7. **``bf16_zero_workspace``** (``prologue == 0`` with a non-empty ``bf16_zero_out``): its
   first ``floor(nbytes / 16) * 16`` bytes are zeroed, as AITER's int4 loop does, by a
   separate ``zero_`` (one more launch on a GPU); it must be contiguous.
8. **``M_logical``** (``mxfp4_moe_sort``) is M, as in AITER: the first ``M_logical`` rows of
   ``topk_ids``/``topk_weight`` are sorted, the pad value and ``cumsum_tensor[1]`` are
   ``M_logical``; it must lie in [0, ``topk_ids.shape[0]``] (AITER would read past the end).
   ``mxfp4_moe_sort_quant`` likewise takes ``M = a_input.shape[0]`` and sorts the first M
   rows of ``topk_ids``.
9. **``D_INTER``** is ignored (AITER: ``(void)D_INTER``); it must be an int.
10. **``max_sorted``** (``mxfp4_moe_sort_scales``) is used as AITER uses it: with
    ``BM = max(32, MB)``, exactly ``floor(max_sorted / BM)`` chunks of ``BM`` rows are
    written (``floor(max_sorted / BM) * BM * D_HIDDEN / 32`` bytes of
    ``a_scale_sorted_shuffled``; the bytes after them are not touched).  So with ``MB = 16``
    and ``max_sorted`` an odd multiple of 16 (``_adaptive_moe_sort``'s size can be), the last
    16 rows get no scales, in AITER as here, even where they are valid rows; pass
    ``max_sorted`` rounded up to ``BM``.  AITER reads ``sorted_token_ids`` only below
    ``cumsum_tensor[0]``, so ``max_sorted`` may exceed its length; here it must lie in
    [0, ``round_up(sorted_token_ids.numel(), BM)``] (rows past the length are padding).
11. **Scale-shuffle padding.**  A row of a written chunk that is padding (token >= M) or at
    or past ``cumsum_tensor[0]``: AITER stores the scales of token 0 there (its ``tid = 0``
    fallback), ours stores 0.  The GEMM drops those rows (their ``m_indices`` is M).  The
    layout (``BK = 256``, ``MN_PACK = 2``) and every other byte are the same.
12. **NaN/Inf blocks (quant).**  Ours: a block of 32 holding NaN or +-Inf gets scale byte
    255 and 16 zero bytes (docs/ops.md).  AITER takes amax as the largest bf16 bit pattern
    ``& 0x7FFF`` and computes ``((bits(fp32(amax) * (1/6)) + 0x7FFFFF) >> 23) & 0xFF``: a
    block holding a NaN gets scale byte 0 (the sum wraps past 0xFF), a block holding +-Inf
    and no NaN gets 254; its nibbles are whatever gfx950's ``v_cvt_scalef32_pk_fp4_bf16``
    makes of the block with the float of bits ``scale << 23`` (0.0, or 2^127).  Finite
    blocks: the same scale formula (``min(254, the exponent of amax * fp32(1/6) rounded
    up)``); AITER converts the elements with that instruction, ours rounds
    ``x * 2^(127 - s)`` to nearest-even (docs/ops.md); not compared on hardware here.
13. **Scatter-reduce arithmetic.**  AITER accumulates with ``fmaf`` (one rounding per
    term), ours rounds each product and each sum separately (docs/ops.md): the fp32 sums
    can differ in the last bit, which sometimes survives the rounding to bf16.  A dropped
    pair adds ``fma(0, 0, acc)`` in AITER (turning a ``-0.0`` sum into ``+0.0``); ours skips
    it.  A NaN sum is 0x7FC0 in ours.
14. **Scatter-reduce-q decode.**  AITER passes the block scale to gfx950's
    ``v_cvt_scalef32_pk_f32_fp4`` as the float with bits ``e8 << 23``: 0.0 for byte 0 and
    +Inf for byte 255, where ours decodes 2^-127 (not flushed) and NaN.  Whether the
    instruction reads that float's value or only its exponent field (which would give ours)
    was not checked; for bytes 1..254 the float is exactly 2^(e8-127) in both.
15. **Instances.**  AITER keys instances on all of ``(NE, TOPK, MB, D_HIDDEN)`` (the scatter
    on ``(D_HIDDEN, TOPK, MB >= 128)``); ours on the parameters each kernel uses
    (``moe_sort_e{NE}_k{TOPK}``, ``mxfp4_quant_d{D_HIDDEN}``, ...).  So a call AITER would
    refuse for want of an instance may run here, and ``NE``/``TOPK``/``MB`` that a kernel
    does not use are only range-checked.
16. **Buffer shapes and dtypes.**  AITER passes ``a_quant``/``a_scale`` 1-D
    (``[M*D_HIDDEN/2]``, ``[M*D_HIDDEN/32]``) or 2-D, and may type them
    ``float4_e2m1fn_x2``/``float8_e8m0fnu``; the adapters take any contiguous uint8 (or
    those 1-byte types) buffer with enough bytes and use its first bytes as our 2-D
    ``[M, D_HIDDEN/2]``/``[M, D_HIDDEN/32]``.  The int32/float32 sort buffers may have any
    contiguous shape.  ``a_scale`` of ``mxfp4_moe_sort_scales`` must be 2-D
    ``[M, D_HIDDEN/32]``: AITER takes M from ``a_scale.size(0)``, so a flat one would be
    misread.  The scatters take M from ``out.shape[0]`` (as AITER) and use the first
    ``M*TOPK`` entries of ``reverse_sorted``; rows of ``flat_out``/``flat_out_q``/
    ``flat_out_scale`` beyond ``sorted_weights.numel()`` (or beyond each other) cannot be
    addressed by a valid row index and are ignored.
17. **Devices.**  AITER's kernels run on gfx950 only; ours on CPU, CUDA and ROCm.

18. **``prepare_mxfp4_moe_aux(shapes)``** returns ``None`` or raises a ``RuntimeError``
    naming the missing instance keys, as AITER's, but checks every instance of each shape
    (AITER: its two BM16 sort instances per ``(NE, TOPK, D_HIDDEN)``) against our catalog,
    then builds or loads the module of this process's backend; its error
    (:class:`MissingInstancesError`) carries ``missing_keys`` (ours) and ``missing_shapes``
    and names the ``aiter-aux add-shape`` command; shape values must be ints (AITER:
    ``int(v)``).

``is_mxfp4_moe_shape_supported(expert, model_dim, inter_dim, topk)``,
``is_mxfp4_moe_scatter_supported(model_dim, topk)`` (True when some catalog shape has that
``model_dim`` and ``topk``) and ``MXFP4_MOE_SUPPORTED_SHAPES`` have AITER's signatures and
meaning, over our catalog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# ``from ..ops.moe_mxfp4_aux import name`` would run that module's ``__getattr__`` for
# ``__path__``, which imports the ops (torch, the JIT); importing the module object does not.
from ..ops import moe_mxfp4_aux as _catalog
from ._aiter_args import (
    _bytes2d,
    _check_sort3stage_ws,
    _contiguous,
    _flat,
    _init_source,
    _int,
    _no_overlap,
    _ops,
    _params,
    _q_dtypes,
    _routing,
    _rows,
    _scale_dtypes,
    _scatter_common,
    _sort_buffers,
    _tensor,
    _torch,
    _workspace_target,
    _zero_target,
)
from ._aiter_prepare import MissingInstancesError, prepare_mxfp4_moe_aux

MXFP4_MOE_SUPPORTED_SHAPES = _catalog.MXFP4_MOE_SUPPORTED_SHAPES
is_mxfp4_moe_shape_supported = _catalog.is_mxfp4_moe_shape_supported
is_mxfp4_moe_scatter_supported = _catalog.is_mxfp4_moe_scatter_supported

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "MXFP4_MOE_SUPPORTED_SHAPES",
    "is_mxfp4_moe_shape_supported",
    "is_mxfp4_moe_scatter_supported",
    "prepare_mxfp4_moe_aux",
    "MissingInstancesError",
    "mxfp4_moe_sort_quant",
    "mxfp4_moe_sort",
    "mxfp4_moe_quant",
    "mxfp4_moe_sort_scales",
    "mxfp4_moe_scatter_reduce",
    "mxfp4_moe_scatter_reduce_q",
]


# ------------------------------------------------------------------------------ the ops


def mxfp4_moe_sort_quant(
    a_input: Tensor,
    topk_ids: Tensor,
    topk_weight: Tensor,
    sorted_token_ids: Tensor,
    sorted_expert_ids: Tensor,
    cumsum_tensor: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    a_quant: Tensor,
    a_scale: Tensor,
    m_indices: Tensor,
    bf16_zero_out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Sort the routing and quantise the activations in one call (our
    :func:`aiter_aux.ops.moe_sort_quant_out`).

    Args:
        a_input: bf16 ``[M, D_HIDDEN]``; M is ``a_input.shape[0]``.
        topk_ids: int32 ``[>= M, TOPK]``; the first M rows are sorted.
        topk_weight: float32, the shape of ``topk_ids``.
        sorted_token_ids: int32, >= ``round_up(M*TOPK + min(NE, M*TOPK)*(MB-1), MB)``
            elements (``max_sorted``): ``t | k << 24`` per row, pad M.
        sorted_expert_ids: int32, >= ``max_sorted / MB``: the expert of each block.
        cumsum_tensor: int32, >= 2: ``[rows used, M]`` (our ``num_valid_ids``).
        reverse_sorted: int32, >= ``M*TOPK``: the row of pair ``(t, k)``, or -1.
        sorted_weights: float32, >= ``max_sorted``; pad 0.0.
        a_quant: uint8 (or float4_e2m1fn_x2), >= ``M*D_HIDDEN/2`` bytes, any shape: e2m1.
        a_scale: uint8 (or float8_e8m0fnu), >= ``M*D_HIDDEN/32`` bytes, any shape: e8m0.
        m_indices: int32, >= ``max_sorted``: the token of each row, pad M.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M*D_HIDDEN`` elements are
            zeroed in the same call (or set to ``bf16_out_init``'s).
        NE, TOPK, D_HIDDEN, MB: the instance: experts, top-k, hidden size, block_m.
        bf16_out_init: None, empty, or a contiguous tensor of ``bf16_zero_out``'s dtype with
            >= ``M*D_HIDDEN`` elements (e.g. the shared expert's output), whose first
            ``M*D_HIDDEN`` are copied, bit for bit, into ``bf16_zero_out`` instead of zeros
            (our ``zero_buf_init``); ignored, as in AITER, when ``bf16_zero_out`` is empty.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    x = _tensor(a_input, "a_input")
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"a_input must be [M, D_HIDDEN] with D_HIDDEN = {d}, got {list(x.shape)}")
    m = x.shape[0]
    ids, w = _routing(topk_ids, topk_weight, topk, m, "M = a_input.shape[0]")
    aq = _bytes2d(a_quant, "a_quant", _q_dtypes(), m, d // 2)
    asc = _bytes2d(a_scale, "a_scale", _scale_dtypes(), m, d // 32)
    zero = _zero_target(bf16_zero_out, m, d)
    init = _init_source(bf16_out_init, bf16_zero_out, zero)
    out, copies, named = _sort_buffers(m, topk, ne, mb, sorted_token_ids,
                                       sorted_weights, m_indices, sorted_expert_ids,
                                       cumsum_tensor, reverse_sorted)  # fmt: skip
    _no_overlap(
        {**named, "a_quant": aq, "a_scale": asc, "bf16_zero_out": zero},
        {"a_input": x, "topk_ids": ids, "topk_weight": w, "bf16_out_init": init},
    )
    _ops().moe_sort_quant_out(ids, w, x, ne, mb, out, aq, asc, zero_buf=zero,
                              zero_buf_init=init)  # fmt: skip
    for dst, src in copies:
        dst.copy_(src)


def mxfp4_moe_sort(
    topk_ids: Tensor,
    topk_weight: Tensor,
    sorted_token_ids: Tensor,
    sorted_expert_ids: Tensor,
    cumsum_tensor: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    m_indices: Tensor,
    bf16_zero_out: Tensor,
    bf16_zero_workspace: Tensor,
    sort3stage_ws: Tensor,
    M_logical: int,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    D_INTER: int,
    MB: int,
    prologue: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Sort the routing (our :func:`aiter_aux.ops.moe_sort_out`).

    Args:
        topk_ids: int32 ``[>= M_logical, TOPK]``; the first ``M_logical`` rows are sorted.
        topk_weight: float32, the shape of ``topk_ids``.
        sorted_token_ids, sorted_expert_ids, cumsum_tensor, reverse_sorted, sorted_weights,
            m_indices: as in :func:`mxfp4_moe_sort_quant`, with M = ``M_logical``.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M_logical*D_HIDDEN`` elements
            are zeroed (or set to ``bf16_out_init``'s) in the same call when ``prologue ==
            0`` (untouched for 1, as in AITER).
        bf16_zero_workspace: empty, or a contiguous tensor whose first
            ``floor(nbytes/16)*16`` bytes are zeroed when ``prologue == 0`` and
            ``bf16_zero_out`` is not empty (a separate ``zero_``).
        sort3stage_ws: the scratch of AITER's three-stage sort: with ``prologue == 1`` an
            int32 tensor of >= ``NE*16 + NE`` elements (AITER's check), else any tensor
            (``torch.empty(0, dtype=torch.int32)``).  Unused here (our sort needs no
            scratch): never read or written.
        M_logical: the number of tokens M, in [0, ``topk_ids.shape[0]``].
        NE, TOPK, D_HIDDEN, MB: the instance.
        D_INTER: ignored (as in AITER).
        prologue: 0 (AITER's one-CTA sort) or 1 (its three-stage sort); the outputs are the
            same, only the zero-init depends on it.
        bf16_out_init: as in :func:`mxfp4_moe_sort_quant`; used when ``bf16_zero_out`` is
            initialised (``prologue == 0``), ignored otherwise, as in AITER.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    _int(D_INTER, "D_INTER")
    pro = _int(prologue, "prologue")
    if pro not in (0, 1):
        raise ValueError(f"prologue must be 0 (one-CTA sort) or 1 (three-stage sort), got {pro}")
    m = _int(M_logical, "M_logical")
    ids, w = _routing(topk_ids, topk_weight, topk, m, "M_logical")
    zero_out = _tensor(bf16_zero_out, "bf16_zero_out")
    _tensor(bf16_zero_workspace, "bf16_zero_workspace")
    _check_sort3stage_ws(sort3stage_ws, ne, pro)
    zero = ws = None
    if pro == 0:
        zero = _zero_target(zero_out, m, d)
        if zero_out.numel() > 0:
            ws = _workspace_target(bf16_zero_workspace)
    init = _init_source(bf16_out_init, zero_out, zero)
    out, copies, named = _sort_buffers(m, topk, ne, mb, sorted_token_ids,
                                       sorted_weights, m_indices, sorted_expert_ids,
                                       cumsum_tensor, reverse_sorted)  # fmt: skip
    _no_overlap(
        {**named, "bf16_zero_out": zero, "bf16_zero_workspace": ws},
        {"topk_ids": ids, "topk_weight": w, "bf16_out_init": init},
    )
    _ops().moe_sort_out(ids, w, ne, mb, out, zero_buf=zero, zero_buf_init=init)
    if ws is not None:
        ws.zero_()
    for dst, src in copies:
        dst.copy_(src)


def mxfp4_moe_quant(
    a_input: Tensor,
    a_quant: Tensor,
    a_scale: Tensor,
    bf16_zero_out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    bf16_out_init: Tensor | None = None,
) -> None:
    """Quantise ``a_input`` to MXFP4 per 1x32 (our :func:`aiter_aux.ops.mxfp4_quant_out`).

    Args:
        a_input: bf16 ``[M, D_HIDDEN]``.
        a_quant: uint8 (or float4_e2m1fn_x2), >= ``M*D_HIDDEN/2`` bytes, any shape: e2m1,
            element 2j in the low nibble of byte j.
        a_scale: uint8 (or float8_e8m0fnu), >= ``M*D_HIDDEN/32`` bytes, any shape: e8m0,
            row-major ``[M, D_HIDDEN/32]``.
        bf16_zero_out: empty, or a 2-byte tensor whose first ``M*D_HIDDEN`` elements are
            zeroed, or set to ``bf16_out_init``'s (a separate ``zero_`` or ``copy_`` after
            the quant).
        NE, TOPK, D_HIDDEN, MB: the instance (the kernel uses D_HIDDEN only).
        bf16_out_init: as in :func:`mxfp4_moe_sort_quant`.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    x = _tensor(a_input, "a_input")
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"a_input must be [M, D_HIDDEN] with D_HIDDEN = {d}, got {list(x.shape)}")
    m = x.shape[0]
    aq = _bytes2d(a_quant, "a_quant", _q_dtypes(), m, d // 2)
    asc = _bytes2d(a_scale, "a_scale", _scale_dtypes(), m, d // 32)
    zero = _zero_target(bf16_zero_out, m, d)
    init = _init_source(bf16_out_init, bf16_zero_out, zero)
    _no_overlap(
        {"a_quant": aq, "a_scale": asc, "bf16_zero_out": zero},
        {"a_input": x, "bf16_out_init": init},
    )
    _ops().mxfp4_quant_out(x, aq, asc)
    if init is not None:  # bit for bit, NaN payloads included
        zero.view(_torch().int16).copy_(init.view(_torch().int16))
    elif zero is not None:
        zero.zero_()


def mxfp4_moe_sort_scales(
    a_scale: Tensor,
    sorted_token_ids: Tensor,
    cumsum_tensor: Tensor,
    a_scale_sorted_shuffled: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
    max_sorted: int,
) -> None:
    """Shuffle the per-token scales into the grouped GEMM's layout in sorted row order (our
    :func:`aiter_aux.ops.moe_sort_scales_out`).

    Args:
        a_scale: uint8 (or float8_e8m0fnu) ``[M, D_HIDDEN/32]`` (2-D: M is its first size).
        sorted_token_ids: int32, >= ``max_sorted`` elements (from the sort).
        cumsum_tensor: int32, >= 2 (from the sort; element 0 is read).
        a_scale_sorted_shuffled: uint8 (or float8_e8m0fnu), any shape, >=
            ``floor(max_sorted/BM)*BM*D_HIDDEN/32`` bytes with ``BM = max(32, MB)``; exactly
            that many leading bytes are written.
        NE, TOPK, D_HIDDEN, MB: the instance (D_HIDDEN a multiple of 256).
        max_sorted: the sort capacity: ``floor(max_sorted/BM)`` chunks are written; in
            [0, ``round_up(sorted_token_ids.numel(), BM)``].

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    ms = _int(max_sorted, "max_sorted")
    s = _tensor(a_scale, "a_scale")
    if s.dtype not in _scale_dtypes():
        raise TypeError(
            f"a_scale must have dtype torch.uint8 or torch.float8_e8m0fnu, got {s.dtype}"
        )
    if s.dim() != 2 or s.shape[1] != d // 32:
        raise ValueError(
            f"a_scale must be 2-D [M, D_HIDDEN/32] = [M, {d // 32}] (AITER takes M from "
            f"a_scale.size(0)), got shape {list(s.shape)}"
        )
    s = _contiguous(s, "a_scale").view(torch.uint8)
    sti = _flat(sorted_token_ids, "sorted_token_ids", torch.int32, 0, "")
    nv = _flat(cumsum_tensor, "cumsum_tensor", torch.int32, 2, "[rows, M]")
    bm = max(32, mb)
    limit = -(-sti.numel() // bm) * bm
    if not 0 <= ms <= limit:
        raise ValueError(
            f"max_sorted = {ms} must lie in [0, round_up(sorted_token_ids.numel(), BM) = "
            f"{limit}] (BM = max(32, MB) = {bm})"
        )
    rows = ms // bm * bm
    sti = sti[: min(rows, sti.numel())]  # our op writes ceil(len / BM) * BM = rows rows
    out = _bytes2d(a_scale_sorted_shuffled, "a_scale_sorted_shuffled", _scale_dtypes(),
                   rows, d // 32)  # fmt: skip
    _no_overlap(
        {"a_scale_sorted_shuffled": out},
        {"a_scale": s, "sorted_token_ids": sti, "cumsum_tensor": nv},
    )
    _ops().moe_sort_scales_out(s, sti, nv, mb, out)


def mxfp4_moe_scatter_reduce(
    flat_out: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
) -> None:
    """Weighted top-k reduce of the expert rows back to tokens (our
    :func:`aiter_aux.ops.moe_scatter_reduce_out`):
    ``out[t] = bf16(sum_k flat_out[p] * sorted_weights[p])``, ``p = reverse_sorted[t*TOPK+k]``,
    skipping ``p < 0``.

    Args:
        flat_out: bf16 ``[rows, D_HIDDEN]`` in sorted row order.
        reverse_sorted: int32, >= ``M*TOPK`` elements (the first ``M*TOPK`` are read).
        sorted_weights: float32 1-D (rows past its length are never addressed).
        out: bf16 ``[M, D_HIDDEN]``; M is ``out.shape[0]``.
        NE, TOPK, D_HIDDEN, MB: the instance (the kernel uses TOPK and D_HIDDEN).

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    o, rev, sw = _scatter_common(out, reverse_sorted, sorted_weights, topk, d)
    eo = _rows(_tensor(flat_out, "flat_out"), "flat_out", d, (torch.bfloat16,))
    eo = eo[: sw.numel()]
    _no_overlap({"out": o}, {"flat_out": eo, "reverse_sorted": rev, "sorted_weights": sw})
    _ops().moe_scatter_reduce_out(eo, rev, sw, topk, o)


def mxfp4_moe_scatter_reduce_q(
    flat_out_q: Tensor,
    flat_out_scale: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    out: Tensor,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    MB: int,
) -> None:
    """:func:`mxfp4_moe_scatter_reduce` with MXFP4 expert rows (our
    :func:`aiter_aux.ops.moe_scatter_reduce_q_out`).

    Args:
        flat_out_q: uint8 (or float4_e2m1fn_x2) ``[rows, D_HIDDEN/2]``: e2m1 pairs.
        flat_out_scale: uint8 (or float8_e8m0fnu) ``[rows', D_HIDDEN/32]``, row-major e8m0;
            ``min(rows, rows', sorted_weights.numel())`` rows are addressable.
        reverse_sorted, sorted_weights, out, NE, TOPK, D_HIDDEN, MB: as in
            :func:`mxfp4_moe_scatter_reduce`.

    Raises:
        ValueError, TypeError: see the module docstring (checks); nothing is written then.
    """
    torch = _torch()
    ne, topk, d, mb = _params(NE, TOPK, D_HIDDEN, MB)
    o, rev, sw = _scatter_common(out, reverse_sorted, sorted_weights, topk, d)
    q = _rows(_tensor(flat_out_q, "flat_out_q"), "flat_out_q", d // 2, _q_dtypes())
    s = _rows(_tensor(flat_out_scale, "flat_out_scale"), "flat_out_scale", d // 32,
              _scale_dtypes())  # fmt: skip
    rows = min(q.shape[0], s.shape[0], sw.numel())
    q = q.view(torch.uint8)[:rows]
    s = s.view(torch.uint8)[:rows]
    _no_overlap(
        {"out": o},
        {"flat_out_q": q, "flat_out_scale": s, "reverse_sorted": rev, "sorted_weights": sw},
    )
    _ops().moe_scatter_reduce_q_out(q, s, rev, sw, topk, o)
