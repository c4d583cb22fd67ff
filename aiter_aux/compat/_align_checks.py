"""The checks of the align drop-ins of :mod:`._align`: the reference's rules
(:mod:`aiter_aux.reference.compat`) as each peer's function states them, run where a call
is not the plain one its fast path takes, and on every error to name the bad argument.

The checks that read tensor values (SGLang ids in ``[-1, E)``, vLLM map values with
``ignore_invalid_experts``) run on CPU tensors: eagerly a ``ValueError`` naming the first bad
value, under ``torch.compile`` traced into the graph (``torch._assert_async``).
Importing this module loads nothing.
"""

from __future__ import annotations

SGLANG_PLUS_ONE = "E is SGLang's num_experts - 1"


def _checking_values(t) -> bool:
    """Whether the value checks run eagerly: on CPU tensors, outside a ``torch.compile``
    trace (there :func:`_traced_check` puts them into the graph)."""
    import torch

    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _traced_check(t, lo: int | None, hi: int, message: str) -> None:
    """Under ``torch.compile``, on CPU tensors: the value check ``lo <= t < hi`` (``lo``
    None: ``t < hi``) traced into the graph as ``torch._assert_async``, so that the compiled
    call raises (``RuntimeError(message)``) where the eager one raises ``ValueError``.
    Nothing elsewhere: on the GPU the check would synchronise (eager does not make it)."""
    import torch

    if t.device.type == "cpu" and torch.compiler.is_compiling():
        ok = t < hi if lo is None else (t >= lo) & (t < hi)
        torch._assert_async(ok.all(), message)


def most_buckets() -> int:
    """The most buckets of SGLang's format that our sort takes: the routed experts (at most
    the sort's ``MAX_NUM_EXPERTS`` less one, and sgl-kernel's limit) plus one."""
    from ..reference import compat as R
    from ..validation import MAX_NUM_EXPERTS

    return min(R.SGLANG_MAX_EXPERTS + 1, MAX_NUM_EXPERTS)


def _vllm_checks(topk_ids, block_size, num_experts, expert_map, pad, ignore, scatter):
    """The reference's checks of vLLM's function; returns ``(block_size, num_experts, pad,
    ignore, scatter)`` as plain ints and bools."""
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    pad = R._check_flag(pad, "pad_sorted_ids")
    ignore = R._check_flag(ignore, "ignore_invalid_experts")
    scatter = R._check_flag(scatter, "return_scatter_idx")
    bs, e, _ = R._check_sizes(
        topk_ids, block_size, num_experts, R.VLLM_MAX_EXPERTS,
        lambda n, e, b: R.vllm_align_capacity(n, e, b, pad),
    )  # fmt: skip
    if expert_map is not None:
        expert_map = check_expert_map(expert_map, topk_ids.device)
        if expert_map.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {expert_map.numel()}"
            )
        if ignore and _checking_values(expert_map):
            R._check_values(expert_map[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
        elif ignore:
            _traced_check(expert_map[:e], -1, e, f"expert_map values must be -1 or in [0, {e})")
    if scatter and expert_map is not None and not ignore:
        raise ValueError("scatter_idx with expert_map requires ignore_invalid_experts")
    return bs, e, pad, ignore, scatter


def _sglang_checks(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                   num_tokens_post_pad, pad, ignore, srt=False) -> tuple:  # fmt: skip
    """The reference's checks of sgl-kernel's function (``num_experts``: the buckets;
    ``srt``: called by the srt form, whose checks ran); returns ``(block_size, routed
    experts, ignore)``."""
    from ..reference import compat as R
    from ..validation import validate_int

    topk_ids = R._check_ids(topk_ids, (1, 2))
    buckets = validate_int(num_experts, "num_experts")
    most = most_buckets()  # buckets: routed + 1
    if not 2 <= buckets <= most:
        raise ValueError(
            f"num_experts must be in [2, {most}] (SGLang's num_experts + 1: the routed "
            f"experts, at most {most - 1} in our sort, plus one), got {buckets}"
        )
    bs, e, cap = R._check_sizes(topk_ids, block_size, buckets - 1, R.SGLANG_MAX_EXPERTS,
                                R.sglang_align_capacity)  # fmt: skip
    R._check_flag(pad, "pad_sorted_token_ids")
    ignore = R._check_flag(ignore, "ignore_invalid_expert")
    R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, cap), ("experts_ids", experts_ids, -(-cap // bs)),
         ("num_tokens_post_pad", num_tokens_post_pad, 1)), bs)  # fmt: skip
    _check_sglang_values(topk_ids, e, ignore, srt)
    return bs, e, ignore


def _check_sglang_values(topk_ids, e: int, ignore: bool, srt: bool = False) -> None:
    """SGLang's ids in ``[-1, e)`` (``ignore``: ``< e``) for ``e`` routed experts; the
    message says what ``e`` is of the caller's num_experts (``srt``: the srt form's)."""
    if not topk_ids.numel():
        return
    if not _checking_values(topk_ids):
        rule = f"< {e}" if ignore else f"in [-1, {e})"
        message = f"topk_ids values must be {rule} ({_bound(e, srt)})"
        _traced_check(topk_ids, None if ignore else -1, e, message)
    else:
        from ..reference import compat as R

        try:
            R.check_sglang_ids(topk_ids, e, ignore)
        except ValueError as err:
            raise ValueError(f"{err} ({_bound(e, srt)})") from None


def _bound(e: int, srt: bool) -> str:
    """What the ids' bound ``e`` is of the caller's num_experts."""
    return f"{e} = num_experts" if srt else f"{e} = num_experts - 1, the routed experts"


def _srt_checks(topk_ids, block_size, num_experts) -> tuple[int, int]:
    """The srt form's checks, in its terms (``num_experts``: the routed experts)."""
    from ..reference import compat as R
    from ..validation import validate_int

    topk_ids = R._check_ids(topk_ids, (1, 2))
    most = most_buckets() - 1  # the routed experts
    e = validate_int(num_experts, "num_experts")
    if not 1 <= e <= most:
        raise ValueError(f"num_experts must be in [1, {most}] (the routed experts: at most "
                         f"{most} in our sort), got {e}")  # fmt: skip
    bs, e, _ = R._check_sizes(topk_ids, block_size, e, most, R.sglang_align_capacity)
    return bs, e


def _custom_checks(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                   num_tokens_post_pad, maybe_expert_map, scatter_idx) -> tuple:  # fmt: skip
    """The reference's checks of ``vllm._custom_ops.moe_align_block_size``; returns
    ``(block_size, num_experts)`` as ints."""
    from ..reference import compat as R
    from ..validation import check_expert_map

    topk_ids = R._check_ids(topk_ids, None)
    bs, e, _ = R._check_sizes(topk_ids, block_size, num_experts, R.VLLM_MAX_EXPERTS,
                              R.vllm_align_capacity)  # fmt: skip
    n = topk_ids.numel()
    R.check_align_buffers(
        (("sorted_token_ids", sorted_token_ids, R.vllm_align_capacity(n, e, bs)),
         ("experts_ids", experts_ids, None), ("num_tokens_post_pad", num_tokens_post_pad, 1)),
        bs)  # fmt: skip
    if scatter_idx is not None:
        R.check_align_buffers((("scatter_idx", scatter_idx, n),), bs)
        if scatter_idx.numel() != n:
            raise ValueError(
                f"scatter_idx must have topk_ids.numel() = {n} elements, got {scatter_idx.numel()}"
            )
    if maybe_expert_map is not None:
        emap = check_expert_map(maybe_expert_map, topk_ids.device)
        if emap.numel() < e:
            raise ValueError(
                f"expert_map must have >= num_experts ({e}) entries, got {emap.numel()}"
            )
        if _checking_values(emap):
            R._check_values(emap[:e], -1, e, "expert_map", f"-1 or in [0, {e})")
        else:
            _traced_check(emap[:e], -1, e, f"expert_map values must be -1 or in [0, {e})")
    return bs, e
