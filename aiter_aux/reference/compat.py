"""Reference of vLLM's and SGLang's MoE routing-sort and reduce formats (docs/compat.md).

* :func:`vllm_moe_align_block_size` and :func:`vllm_moe_sum`: vLLM's
  ``fused_moe.moe_align_block_size`` and ``_custom_ops.moe_sum``.
* :func:`sglang_moe_align_block_size` and :func:`sglang_moe_sum_reduce`: SGLang's
  ``moe_align_block_size`` (the "+1 offset" buckets) and ``moe_sum_reduce``.

Same signatures, output tensors and meaning as the peers.  Sorted ids are flat pair indices
``t * topk + k`` padded with ``topk_ids.numel()``.  Inside an expert the pairs are in
ascending pair index; the peers' generic paths place them in atomic-counter order, so the
outputs equal theirs up to the order within an expert's rows.  The sums reproduce the peers'
arithmetic: fp32 accumulation from +0.0 in ``k`` order, each add rounded to fp32, one
rounding to the output dtype (round to nearest even), and a NaN result written as the
canonical NaN of NVIDIA's conversions (:data:`CANONICAL_NAN_BITS`).

Input checks run before any work (TypeError for a wrong type or dtype, ValueError for the
rest) and include the data-dependent id checks (one host synchronisation on GPU).
"""

from __future__ import annotations

import torch

from aiter_aux import validation as V

from . import chunks

#: vLLM: ``round_up(num_experts, 32) < 1024`` (one thread per expert of a 1024-thread scan).
VLLM_MAX_EXPERTS = 992
#: SGLang: ``num_experts + 1`` buckets (bucket 0 holds the -1 ids), at most 8192.
SGLANG_MAX_EXPERTS = 8191
#: Sorted ids and counts are int32.
INT32_MAX = (1 << 31) - 1
#: dtypes of ``topk_ids`` (the peers also take other integer dtypes; see docs/compat.md).
ID_DTYPES = (torch.int32, torch.int64)
#: dtypes of the sums' ``input`` / ``output``.
SUM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: A NaN sum is written with these bits (``cvt.rn`` on sm_80+ and NVIDIA's fp32 adds).
CANONICAL_NAN_BITS = {torch.bfloat16: 0x7FFF, torch.float16: 0x7FFF, torch.float32: 0x7FFFFFFF}


def vllm_align_capacity(
    numel: int, num_experts: int, block_size: int, pad_sorted_ids: bool = False
) -> int:
    """Length of vLLM's ``sorted_token_ids``: ``numel + num_experts * (block_size - 1)``,
    rounded up to ``block_size`` when ``pad_sorted_ids``, then ``min(numel * block_size, .)``
    when ``numel < num_experts``.  ``expert_ids`` has ``ceil(capacity / block_size)``."""
    cap = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        cap = -(-cap // block_size) * block_size
    if numel < num_experts:
        cap = min(numel * block_size, cap)
    return cap


def sglang_align_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """Length of SGLang's ``sorted_token_ids``: ``numel * block_size`` when
    ``numel < num_experts + 1``, else ``numel + (num_experts + 1) * (block_size - 1)``."""
    if numel < num_experts + 1:
        return numel * block_size
    return numel + (num_experts + 1) * (block_size - 1)


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------


def _check_ids(topk_ids: object, ndims: tuple[int, ...] | None) -> torch.Tensor:
    """``ndims`` None: any shape (read as a flat array)."""
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype not in ID_DTYPES:
        raise TypeError(
            f"topk_ids must have dtype torch.int32 or torch.int64, got {topk_ids.dtype}"
        )
    if ndims is not None and topk_ids.dim() not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"topk_ids must be {want}, got {topk_ids.dim()}-D")
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be contiguous")
    return topk_ids


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _check_sizes(topk_ids, block_size, num_experts, max_experts, capacity_fn) -> tuple:
    bs = V.validate_int(block_size, "block_size")
    e = V.validate_int(num_experts, "num_experts")
    if bs < 1:
        raise ValueError(f"block_size must be >= 1, got {bs}")
    if not 1 <= e <= max_experts:
        raise ValueError(f"num_experts must be in [1, {max_experts}], got {e}")
    cap = capacity_fn(topk_ids.numel(), e, bs)
    if cap > INT32_MAX:
        raise ValueError(f"the sorted_token_ids capacity {cap} must fit in int32")
    return bs, e, cap


def _check_values(values: torch.Tensor, lo: int, hi: int, name: str, rule: str) -> None:
    """All values in ``[lo, hi)``, or ValueError (reads the tensor back to the host)."""
    if values.numel() and not bool(((values >= lo) & (values < hi)).all()):
        bad = values[(values < lo) | (values >= hi)][0].item()
        raise ValueError(f"{name} values must be {rule}, got {bad}")


# --------------------------------------------------------------------------------------------
# the sort
# --------------------------------------------------------------------------------------------


def _align(bucket, n_buckets, block_size, cap, bucket_expert):
    """Sort the pairs into block-padded bucket segments.

    ``bucket``: int64 ``[numel]``, the bucket of each pair in ``[0, n_buckets)``, or -1 for a
    dropped pair.  Buckets in ascending order, pairs of a bucket in ascending pair index, each
    bucket padded up to a multiple of ``block_size``; an empty bucket takes no rows.
    ``sorted_ids``: int32 ``[cap]``, the pair index or ``numel`` (padding and every row at or
    past the total).  ``expert_ids``: int32 ``[ceil(cap / block_size)]``,
    ``bucket_expert[bucket]`` per used block, -1 past them.  ``total``: int32 ``[1]``.
    """
    dev = bucket.device
    numel = bucket.numel()
    i64 = dict(dtype=torch.int64, device=dev)
    valid = bucket >= 0
    counts = torch.bincount(bucket[valid], minlength=n_buckets)
    padded = (counts + block_size - 1) // block_size * block_size
    seg_start = torch.cumsum(padded, 0) - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    total = int(padded.sum())
    n_valid = int(counts.sum())
    # Unique keys: bucket-major, pair index minor; dropped pairs sort last.
    key = torch.where(valid, bucket, n_buckets) * max(numel, 1) + torch.arange(numel, **i64)
    pairs = torch.argsort(key)[:n_valid]
    pb = bucket[pairs]
    rows = seg_start[pb] + torch.arange(n_valid, **i64) - cnt_start[pb]
    sorted_ids = torch.full((cap,), numel, dtype=torch.int32, device=dev)
    sorted_ids[rows] = pairs.to(torch.int32)
    expert_ids = torch.full((-(-cap // block_size),), -1, dtype=torch.int32, device=dev)
    block_bucket = torch.repeat_interleave(torch.arange(n_buckets, **i64), padded // block_size)
    expert_ids[: total // block_size] = bucket_expert[block_bucket].to(torch.int32)
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=dev)


@torch.no_grad()
def vllm_moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    pad_sorted_ids: bool = False,
    ignore_invalid_experts: bool = False,
    return_scatter_idx: bool = False,
) -> tuple[torch.Tensor, ...]:
    """vLLM's ``moe_align_block_size``: sort the ``(t, k)`` pairs by expert into
    block-padded segments.

    ``topk_ids`` is read as a flat array (any shape, as vLLM's kernel reads it): pair ``i``
    is its ``i``-th element, ``t * topk + k`` for ``[M, topk]``.  A pair takes part when
    ``0 <= id < num_experts`` (other ids are dropped).  With ``expert_map`` and
    ``ignore_invalid_experts``, the sort runs over the local ids ``expert_map[id]`` and drops
    pairs that map to -1.  With ``expert_map`` and not ``ignore_invalid_experts``, the sort
    runs over the global ids and afterwards ``expert_ids = expert_map[expert_ids]``: -1 for
    the blocks of other ranks' experts, and ``expert_map[-1]`` (the map's last entry, by
    Python indexing) for the blocks past the
    used ones.  ``num_experts`` is the global count whenever a map is given.

    Args:
        topk_ids: int32 or int64, any shape (usually ``[M, topk]``), contiguous.
        block_size: rows per block, >= 1.
        num_experts: ``[1, 992]``.
        expert_map: optional int32 1-D, ``>= num_experts`` entries, each -1 or a local id in
            ``[0, num_experts)`` (read only when ``ignore_invalid_experts``).
        pad_sorted_ids, ignore_invalid_experts, return_scatter_idx: bools.

    Returns:
        ``(sorted_ids, expert_ids, num_tokens_post_pad[, scatter_idx])``: int32
        ``[cap]`` (:func:`vllm_align_capacity`), int32 ``[ceil(cap / block_size)]``, int32
        ``[1]`` (rows used, a multiple of ``block_size``), and with ``return_scatter_idx``
        int32 ``[numel, 1]`` (``i`` for a pair that takes part, else -1).  Every element
        is written: padding rows and rows past the total hold ``M * topk``; ``expert_ids``
        holds -1 past the used blocks (mapped as above).

    Raises:
        TypeError, ValueError: see the module docstring; ``return_scatter_idx`` with
            ``expert_map`` needs ``ignore_invalid_experts`` (ValueError, as in vLLM).
    """
    topk_ids = _check_ids(topk_ids, None)
    pad = _check_flag(pad_sorted_ids, "pad_sorted_ids")
    ignore = _check_flag(ignore_invalid_experts, "ignore_invalid_experts")
    want_scatter = _check_flag(return_scatter_idx, "return_scatter_idx")
    bs, e, cap = _check_sizes(
        topk_ids, block_size, num_experts, VLLM_MAX_EXPERTS,
        lambda n, e, b: vllm_align_capacity(n, e, b, pad),
    )  # fmt: skip
    if expert_map is not None:
        expert_map = V.check_expert_map(expert_map, topk_ids.device)
        if expert_map.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {expert_map.numel()}"
            )
        if ignore:
            _check_values(expert_map[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
    if want_scatter and expert_map is not None and not ignore:
        raise ValueError("scatter_idx with expert_map requires ignore_invalid_experts")

    ids = topk_ids.reshape(-1).to(torch.int64)
    local = torch.where((ids >= 0) & (ids < e), ids, -1)
    if expert_map is not None and ignore:
        mapped = expert_map.to(torch.int64)[local.clamp_min(0)]
        local = torch.where(local >= 0, mapped, -1)
    arange_e = torch.arange(e, device=ids.device)
    sorted_ids, expert_ids, total = _align(local, e, bs, cap, arange_e)
    if expert_map is not None and not ignore:
        expert_ids = expert_map[expert_ids.to(torch.int64)]
    if not want_scatter:
        return sorted_ids, expert_ids, total
    idx = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    scatter_idx = torch.where(local >= 0, idx, -1).reshape(-1, 1)
    return sorted_ids, expert_ids, total, scatter_idx


@torch.no_grad()
def sglang_moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int, ignore_invalid_expert: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's ``moe_align_block_size``: the pairs sorted into ``num_experts + 1`` buckets.

    Bucket 0 holds the pairs with id -1 (filtered by expert parallelism) and comes first; its
    blocks get ``expert_ids = -1``.  Bucket ``e + 1`` holds expert ``e``.  Every bucket is
    padded up to a multiple of ``block_size``, and ``num_tokens_post_pad`` counts the rows
    of all buckets, bucket 0 included.  With ``ignore_invalid_expert`` (sgl-kernel's
    kernels: ``if (ignore_invalid_expert && topk_ids[i] < 0) continue``) a pair with an id
    < 0 is neither counted nor placed: bucket 0 stays empty and takes no rows.

    Args:
        topk_ids: int32 or int64 ``[M, topk]`` (or 1-D), contiguous, every value in
            ``[-1, num_experts)`` (with ``ignore_invalid_expert``: ``< num_experts``).
        block_size: rows per block, >= 1.
        num_experts: ``[1, 8191]``.
        ignore_invalid_expert: a bool.

    Returns:
        ``(sorted_ids, expert_ids, num_tokens_post_pad)``: int32 ``[cap]``
        (:func:`sglang_align_capacity`), int32 ``[ceil(cap / block_size)]``, int32 ``[1]``.
        Rows of a segment past its pairs, and rows at or past the total, hold ``numel``;
        ``expert_ids`` holds -1 past the used blocks (SGLang leaves both regions unwritten
        on some paths; docs/compat.md).

    Raises:
        TypeError, ValueError: see the module docstring; an id outside ``[-1, num_experts)``
            is a ValueError (SGLang reads out of bounds).
    """
    topk_ids = _check_ids(topk_ids, (1, 2))
    bs, e, cap = _check_sizes(topk_ids, block_size, num_experts, SGLANG_MAX_EXPERTS,
                              sglang_align_capacity)  # fmt: skip
    ignore = _check_flag(ignore_invalid_expert, "ignore_invalid_expert")
    check_sglang_ids(topk_ids, e, ignore)
    bucket = topk_ids.reshape(-1).to(torch.int64) + 1
    if ignore:
        bucket = torch.where(bucket >= 1, bucket, -1)
    bucket_expert = torch.arange(-1, e, device=bucket.device)
    return _align(bucket, e + 1, bs, cap, bucket_expert)


def check_sglang_ids(topk_ids: torch.Tensor, num_experts: int, ignore: bool) -> None:
    """SGLang's ids: each in ``[-1, num_experts)``, with ``ignore_invalid_expert`` each
    ``< num_experts`` (a negative id is skipped); else ValueError (SGLang reads out of
    bounds).  Reads the tensor back to the host."""
    if not ignore:
        _check_values(topk_ids, -1, num_experts, "topk_ids", f"in [-1, {num_experts})")
    elif topk_ids.numel() and not bool((topk_ids < num_experts).all()):
        bad = topk_ids[topk_ids >= num_experts][0].item()
        raise ValueError(f"topk_ids values must be < {num_experts}, got {bad}")


@torch.no_grad()
def vllm_custom_moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    maybe_expert_map: torch.Tensor | None,
    scatter_idx: torch.Tensor | None = None,
) -> None:
    """vLLM's ``_custom_ops.moe_align_block_size`` (the kernel under
    :func:`vllm_moe_align_block_size`), out-parameter style: writes every element of
    ``sorted_token_ids`` (``cap = sorted_token_ids.numel()`` rows: the pairs, padding
    ``numel``), the first ``ceil(cap / block_size)`` blocks of ``experts_ids`` (-1 past the
    used ones), ``num_tokens_post_pad[0]`` and, when given, ``scatter_idx`` (``i`` or -1).
    ``maybe_expert_map``: the sort runs over ``expert_map[id]`` and drops -1 (the meaning of
    :func:`vllm_moe_align_block_size` with ``ignore_invalid_experts``).

    Args:
        topk_ids: int32 or int64, any shape (read as a flat array), contiguous.
        num_experts: ``[1, 992]``; block_size: ``>= 1``.
        sorted_token_ids: int32, contiguous, ``>= vllm_align_capacity(numel, num_experts,
            block_size)`` elements (vLLM writes past a shorter one).
        experts_ids: int32, contiguous, ``>= ceil(sorted_token_ids.numel() / block_size)``.
        num_tokens_post_pad: int32, ``>= 1`` element.
        maybe_expert_map: None or int32 1-D, ``>= num_experts`` entries, each -1 or in
            ``[0, num_experts)``.
        scatter_idx: None or int32, contiguous, ``numel`` elements (vLLM's check).

    Raises:
        TypeError, ValueError: before anything is written.
    """
    topk_ids = _check_ids(topk_ids, None)
    bs, e, _ = _check_sizes(topk_ids, block_size, num_experts, VLLM_MAX_EXPERTS,
                            vllm_align_capacity)  # fmt: skip
    n = topk_ids.numel()
    cap = check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, vllm_align_capacity(n, e, bs)),
         ("experts_ids", experts_ids, None),
         ("num_tokens_post_pad", num_tokens_post_pad, 1)), bs)  # fmt: skip
    if scatter_idx is not None:
        check_align_buffers((("scatter_idx", scatter_idx, n),), bs)
        if scatter_idx.numel() != n:
            raise ValueError(
                f"scatter_idx must have topk_ids.numel() = {n} elements, got {scatter_idx.numel()}"
            )
    emap = maybe_expert_map
    if emap is not None:
        emap = V.check_expert_map(emap, topk_ids.device)
        if emap.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {emap.numel()}"
            )
        _check_values(emap[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
    ids = topk_ids.reshape(-1).to(torch.int64)
    local = torch.where((ids >= 0) & (ids < e), ids, -1)
    if emap is not None:
        mapped = emap.to(torch.int64)[local.clamp_min(0)]
        local = torch.where(local >= 0, mapped, -1)
    sti, eid, total = _align(local, e, bs, cap, torch.arange(e, device=ids.device))
    sorted_token_ids.view(-1).copy_(sti)
    experts_ids.view(-1)[: eid.numel()].copy_(eid)
    num_tokens_post_pad.view(-1)[:1].copy_(total)
    if scatter_idx is not None:
        idx = torch.arange(n, dtype=torch.int32, device=ids.device)
        scatter_idx.view(-1).copy_(torch.where(local >= 0, idx, -1))


def check_align_buffers(bufs, block_size: int) -> int:
    """The out-parameter buffers of an align call: each ``(name, tensor, need)`` an int32
    contiguous tensor of ``>= need`` elements; ``experts_ids`` (need None) needs the blocks
    of the ``sorted_token_ids`` before it.  Returns ``sorted_token_ids.numel()`` (0 if
    absent)."""
    cap = 0
    for name, t, need in bufs:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must have dtype torch.int32, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if need is None:
            need = -(-cap // block_size)
        if t.numel() < need:
            raise ValueError(f"{name} must have >= {need} elements, got {t.numel()}")
        if name == "sorted_token_ids":
            cap = t.numel()
    return cap


# --------------------------------------------------------------------------------------------
# the sums
# --------------------------------------------------------------------------------------------


def check_sum_call(input: object, output: object) -> tuple[int, int, int]:
    for name, t in (("input", input), ("output", output)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUM_DTYPES:
            raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {t.dtype}")
    if output.dtype != input.dtype:
        raise TypeError(f"output must have input's dtype {input.dtype}, got {output.dtype}")
    if input.dim() != 3:
        raise ValueError(f"input must be 3-D [M, topk, hidden], got {input.dim()}-D")
    m, topk, d = input.shape
    if topk < 1:
        raise ValueError("input must have topk >= 1 (its dim 1)")
    if tuple(output.shape) != (m, d):
        raise ValueError(f"output must have shape [{m}, {d}], got {list(output.shape)}")
    for name, t in (("input", input), ("output", output)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    V.check_same_device(input=input, output=output)
    V.check_no_overlap({"output": output}, {"input": input})
    return m, topk, d


def check_vllm_sum_call(input, output, topk_ids, expert_map) -> tuple:
    """Every check of :func:`vllm_moe_sum` (the compat adapter makes the same);
    returns ``(topk_ids, expert_map)``, ``expert_map`` None without ``topk_ids``."""
    m, topk, _ = check_sum_call(input, output)
    if topk_ids is None:
        return None, None
    topk_ids = _check_ids(topk_ids, (2,))
    if tuple(topk_ids.shape) != (m, topk):
        raise ValueError(f"topk_ids must have shape [{m}, {topk}], got {list(topk_ids.shape)}")
    V.check_same_device(input=input, topk_ids=topk_ids)
    return topk_ids, V.check_expert_map(expert_map, input.device)


def _round(acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> ``dtype`` rounding to nearest even; NaN -> :data:`CANONICAL_NAN_BITS`."""
    nan = torch.isnan(acc)
    if dtype == torch.bfloat16:  # integer ops: Tensor.to keeps NaN payloads on some devices
        bits = acc.view(torch.int32)
        r = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).to(torch.int16)
        return r.masked_fill_(nan, CANONICAL_NAN_BITS[dtype]).view(dtype)
    if dtype == torch.float16:
        r = acc.to(torch.float16).view(torch.int16)
        return r.masked_fill_(nan, CANONICAL_NAN_BITS[dtype]).view(dtype)
    bits = acc.view(torch.int32).clone()
    return bits.masked_fill_(nan, CANONICAL_NAN_BITS[dtype]).view(dtype)


def sum_slots(topk_ids: torch.Tensor | None, expert_map: torch.Tensor | None):
    """The slots ``(t, k)`` a pad-aware sum adds (None: all): ``topk_ids[t, k] >= 0``, and
    with ``expert_map`` an id inside the map whose entry is ``>= 0``."""
    if topk_ids is None:
        return None
    keep = topk_ids >= 0
    if expert_map is not None:
        ids = topk_ids.to(torch.int64)
        g = expert_map.numel()
        mapped = expert_map[ids.clamp(0, max(g - 1, 0))] if g else torch.full_like(ids, -1)
        keep &= (ids < g) & (mapped >= 0)
    return keep


def _reduce_into(input, output, keep, scale) -> None:
    """``output[t] = round(sum over k in order of fp32(input[t, k]))`` from +0.0, skipping
    ``(t, k)`` where ``keep`` is False; then ``* fp32(scale)`` unless ``scale`` is None."""
    m, topk, d = input.shape
    step = chunks.rows_per_chunk(max(d, 1))  # hidden = 0: nothing to write, no division
    f32 = torch.float32
    factor = None if scale is None else torch.tensor(scale, dtype=f32, device=input.device)
    for t0 in range(0, m, step):
        t1 = min(m, t0 + step)
        acc = torch.zeros(t1 - t0, d, dtype=f32, device=input.device)
        for k in range(topk):
            x = input[t0:t1, k].to(f32, copy=True)  # never a view of input
            if keep is not None:
                x = x.masked_fill_(~keep[t0:t1, k].unsqueeze(1), 0.0)  # +0.0: adds nothing
            acc.add_(x)  # a separate fp32 add per k, no fused multiply-add
        if factor is not None:
            acc.mul_(factor)
        output[t0:t1].copy_(_round(acc, output.dtype))


@torch.no_grad()
def vllm_moe_sum(
    input: torch.Tensor,
    output: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> None:
    """vLLM's ``moe_sum``: ``output[t] = sum over k of input[t, k]`` in fp32, into ``output``.

    With ``topk_ids`` (the pad-aware form) a slot ``(t, k)`` is skipped when
    ``topk_ids[t, k] < 0``, or with ``expert_map`` when its id is past the map or
    ``expert_map[id] < 0``.  ``expert_map`` without ``topk_ids`` is ignored, as in vLLM.
    A token with every slot skipped gets +0.0.

    Args:
        input: float32/float16/bfloat16 ``[M, topk, hidden]``, contiguous.
        output: ``input``'s dtype, ``[M, hidden]``, contiguous, not overlapping ``input``.
        topk_ids: optional int32/int64 ``[M, topk]``, contiguous.
        expert_map: optional int32 1-D.

    Raises:
        TypeError, ValueError: wrong types, dtypes, shapes, devices, or overlap.
    """
    topk_ids, expert_map = check_vllm_sum_call(input, output, topk_ids, expert_map)
    _reduce_into(input, output, sum_slots(topk_ids, expert_map), None)


@torch.no_grad()
def sglang_moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    """SGLang's ``moe_sum(input, output)``: ``output[t] = round(fp32 sum over k of
    input[t, k])``, in ``k`` order from +0.0, one rounding, no scaling (vLLM's
    :func:`vllm_moe_sum` without ``topk_ids``).

    Raises:
        TypeError, ValueError: as :func:`sglang_moe_sum_reduce`.
    """
    check_sum_call(input, output)
    _reduce_into(input, output, None, None)


@torch.no_grad()
def sglang_moe_sum_reduce(
    input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float = 1.0
) -> None:
    """SGLang's ``moe_sum_reduce``: ``output[t] = round(fp32(sum over k of input[t, k]) *
    fp32(routed_scaling_factor))``: the fp32 sum in ``k`` order, one fp32 multiply, one
    rounding (the multiply always happens, also for 1.0).

    Args:
        input: float32/float16/bfloat16 ``[M, topk, hidden]``, contiguous.
        output: ``input``'s dtype, ``[M, hidden]``, contiguous, not overlapping ``input``.
        routed_scaling_factor: a float (rounded to fp32), 1.0 by default (SGLang's JIT
            form's default; the multiply happens for 1.0 too).

    Raises:
        TypeError, ValueError: wrong types, dtypes, shapes, devices, or overlap.
    """
    check_sum_call(input, output)
    scale = V.validate_scale(routed_scaling_factor)
    _reduce_into(input, output, None, scale)
