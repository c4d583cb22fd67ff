"""The gate drop-ins' own checks: what the peers' schemas require and ``moe_route`` would
take another way (a None bias or group count, int64 ids, vLLM's ``is_padding``), in the
peer's words.  Importing this module loads nothing."""

from __future__ import annotations

import numbers
from typing import Any


def _bias(bias: Any, name: str) -> Any:
    """A float bias as float32 (float16 / bfloat16 widen exactly); None stays None.

    Raises:
        TypeError: a bias tensor of another dtype (``name``: the peer's word for it).
    """
    import torch

    if bias is None or not isinstance(bias, torch.Tensor):
        return bias  # the op names a non-tensor
    if bias.dtype in (torch.float16, torch.bfloat16):
        return bias.float()
    if bias.dtype != torch.float32:
        raise TypeError(
            f"{name} must have dtype torch.float32, torch.float16 or torch.bfloat16, got "
            f"{bias.dtype}"
        )
    return bias


def _required(**arguments: Any) -> None:
    """The peer's required arguments (a bias tensor, int groups) that ``moe_route`` would
    take as None (no bias, no groups, another rule) must not be None.

    Raises:
        TypeError: ``"<name> is required, got None"``.
    """
    for name, value in arguments.items():
        if value is None:
            raise TypeError(f"{name} is required, got None")


def _no_overlap(written: dict[str, Any], read: dict[str, Any]) -> None:
    """:func:`~aiter_aux.validation.check_no_overlap` over the tensors among ``written`` and
    ``read`` (the op names any other argument)."""
    import torch

    from ..validation import check_no_overlap

    def tensors(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}

    check_no_overlap(tensors(written), tensors(read))


def _check_pair(topk_weights: Any, topk_ids: Any, ids_name: str) -> None:
    import torch

    for t, name in ((topk_weights, "topk_weights"), (topk_ids, ids_name)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {_kind(t)}")
    if topk_weights.dim() != 2 or topk_ids.shape != topk_weights.shape:
        raise ValueError(
            f"topk_weights and {ids_name} must both be [M, topk], got "
            f"{list(topk_weights.shape)} and {list(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{ids_name} must have dtype torch.int32 or torch.int64, got {topk_ids.dtype}"
        )


def _is_bool(value: object) -> bool:
    """A Python or numpy bool (what a torch schema's ``bool`` takes)."""
    from ..validation.ints import is_bool

    return is_bool(value)


def _kind(value: object) -> str:
    from ..validation.ints import _kind

    return _kind(value)


def _fused_gate_options(scoring_func: Any, apply: Any, factor: Any, shared: Any) -> None:
    """SGLang ``moe_fused_gate``'s options other than the tensors and groups.

    Raises:
        ValueError / TypeError: a value its schema refuses; NotImplementedError: fused
        shared experts.
    """
    from ..validation.ints import validate_int

    if not isinstance(scoring_func, str) or scoring_func.lower() not in ("sigmoid", "softmax"):
        raise ValueError(f"scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}")
    if not _is_bool(apply):
        raise TypeError(
            f"apply_routed_scaling_factor_on_output must be a bool, got {apply!r} ({_kind(apply)})"
        )
    if _is_bool(factor) or not isinstance(factor, numbers.Real):
        raise TypeError(f"routed_scaling_factor must be a float, got {factor!r} ({_kind(factor)})")
    shared = validate_int(shared, "num_fused_shared_experts")
    if shared < 0:
        raise ValueError(f"num_fused_shared_experts must be >= 0, got {shared}")
    if shared:
        raise NotImplementedError(
            "num_fused_shared_experts must be 0: fused shared experts are not supported"
        )
