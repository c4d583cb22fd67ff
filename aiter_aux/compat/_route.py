"""The peers' top-k gates as thin adapters onto :func:`aiter_aux.ops.moe_route_out` /
:func:`aiter_aux.ops.moe_route` (re-exported by :mod:`.vllm`, :mod:`.vllm.custom_ops`,
:mod:`.sglang` and :mod:`.aiter`; docs/compat.md "The gates" lists the peers' rules, their
sources and every difference).

Each takes the peer's arguments, maps them onto ``moe_route``'s options and lets the op
check the tensors (a bad call raises its ``TypeError`` / ``ValueError`` before anything is
written).  The out-buffer gates' common call is one call of the op's builtin
(:func:`_route_call`); the Python checks run only when that call is of another form or is
refused, to name what is wrong in the peer's words.  The bytes are ``moe_route``'s: the
same on every backend and every call.
Importing this module loads nothing; torch and the compiled module are loaded on the first
call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._rename import renamed
from ._route_checks import (
    _bias,
    _check_pair,
    _fused_gate_options,
    _kind,
    _no_overlap,
    _required,
)

if TYPE_CHECKING:
    from torch import Tensor


def _ops() -> Any:
    from .. import ops

    return ops


#: Once imported: the ``moe_route_out`` OpOverload, its C++ callable,
#: ``torch.compiler.is_compiling``, ``torch.int32`` and ``torch.float32``.  Eagerly the
#: out-buffer gates' common call goes to the C++ callable (one Python frame less than the
#: OpOverload), under ``torch.compile`` to the OpOverload, which dynamo traces.
_OP: list = []


def _op() -> list:
    if not _OP:
        import torch

        from .. import ops  # noqa: F401 (defines the op)

        op = torch.ops.aiter_aux.moe_route_out.default
        alloc = torch.ops.aiter_aux.moe_route.default
        _OP.extend((op, op._op, torch.compiler.is_compiling, torch.int32, torch.float32, alloc,
                    alloc._op))  # fmt: skip
    return _OP


def _plain(renormalize: Any, bias: Any, groups: Any, topk_group: Any, scale: Any) -> bool:
    """The options are of the one-call form: ``renormalize`` a bool, no bias or a float32
    one, ``groups`` / ``topk_group`` None or ints >= 1, ``scale`` an int or a float (the op's
    binding checks their values)."""
    return (
        (renormalize is True or renormalize is False)
        and (bias is None or bias.dtype == _OP[4])
        and (groups is None or (type(groups) is int and groups >= 1))
        and (topk_group is None or (type(topk_group) is int and topk_group >= 1))
        and (type(scale) is float or type(scale) is int)
    )


def _route_alloc(
    scores: Any, topk: Any, scoring: int, renormalize: Any, bias: Any, groups: Any,
    topk_group: Any, scale: Any,
) -> Any:  # fmt: skip
    """The allocating gates' common call as one ``moe_route`` op call (``scoring``: the op's
    code): its ``(topk_weights, topk_ids)``, or None, having allocated nothing the caller
    sees, where the call is not of that form or the op refuses it; the full path then names
    what is wrong."""
    ops = _OP or _op()
    try:
        if type(topk) is int and _plain(renormalize, bias, groups, topk_group, scale):
            return (ops[5] if ops[2]() else ops[6])(
                scores, topk, scoring, int(renormalize), groups or 0, topk_group or 0, bias,
                scale,
            )  # fmt: skip
    except Exception:  # noqa: BLE001 (the full path names the error)
        pass
    return None


def _route_call(
    gating: Any, topk_weights: Any, topk_ids: Any, tei: Any, renormalize: Any, bias: Any, *,
    sigmoid: bool = False, groups: Any = None, topk_group: Any = None, scale: Any = 1.0,
) -> bool:  # fmt: skip
    """The out-buffer gates' common call as one ``moe_route_out`` op call, its arguments in
    the op's positional form: int32 ids, ``renormalize`` a bool, no bias or a float32 one,
    ``groups`` / ``topk_group`` None or ints >= 1, ``scale`` an int or a float, the peer's
    buffers of one shape (``tei``: vLLM's ``token_expert_indices``, or None).  Returns
    False, having written nothing, where the call is not of that form or the op refuses it
    (its binding checks before any write): the full path then handles it and names what is
    wrong."""
    op, raw, compiling, i32 = (_OP or _op())[:4]
    try:
        shape = topk_weights.shape
        if (
            topk_ids.dtype == i32
            and topk_ids.shape == shape
            and (tei is None or tei.shape == shape)
            and _plain(renormalize, bias, groups, topk_group, scale)
        ):
            (op if compiling() else raw)(
                gating, shape[1], topk_weights, topk_ids, int(sigmoid), int(renormalize),
                groups or 0, topk_group or 0, bias, scale, tei,
            )  # fmt: skip
            return True
    except Exception:  # noqa: BLE001 (the full path names the error)
        pass
    return False


def _route_into(gating: Tensor, topk_weights: Tensor, topk_ids: Tensor, **options: Any) -> None:
    """``moe_route_out`` into the peer's buffers (topk = their columns; ``options`` are the
    op's, ``token_expert_indices`` included); int64 ids are written through an int32 buffer,
    whose first M rows are copied back (rows past M are left as they are, as with int32
    ids)."""
    import torch

    ops = _ops()
    topk = topk_weights.shape[1] if topk_weights.dim() == 2 else 0
    if isinstance(topk_ids, torch.Tensor) and topk_ids.dtype == torch.int64:
        # The op sees a fresh int32 buffer: the int64 one is checked against the others here.
        tei = options.get("token_expert_indices")
        _no_overlap(
            {"topk_weights": topk_weights, "topk_ids": topk_ids, "token_expert_indices": tei},
            {"router_logits": gating, "correction_bias": options.get("correction_bias")},
        )
        ids32 = torch.empty(topk_ids.shape, dtype=torch.int32, device=topk_ids.device)
        ops.moe_route_out(gating, topk, topk_weights, ids32, **options)
        m = gating.shape[0]  # the op accepted it: a 2-D [M, E] tensor
        topk_ids[:m].copy_(ids32[:m])
        return
    ops.moe_route_out(gating, topk, topk_weights, topk_ids, **options)


# ------------------------------------------------------------------------------ vLLM
_M = "num_tokens (M)"  # the op's term for a call's tokens: the rows of the caller's logits


def _caller_names(logits: str, **others: str) -> dict[str, str]:
    """moe_route's words -> the peer's: its logits argument (and their rows, M), ``others``."""
    return {"router_logits": logits, _M: f"M (the rows of {logits})", **others}


_VLLM_SOFTMAX_NAMES = _caller_names("gating_output", correction_bias="e_score_correction_bias")


def vllm_topk_softmax(
    topk_weights: Tensor,
    topk_ids: Tensor,
    token_expert_indices: Tensor,
    gating_output: Tensor,
    renormalize: bool = False,
    e_score_correction_bias: Tensor | None = None,
    is_padding: Tensor | None = None,
) -> None:
    """vLLM's ``_custom_ops.topk_softmax``: softmax over each row of ``gating_output``
    [M, E], its ``topk`` largest choices (topk = ``topk_weights.shape[1]``; choice = score +
    ``e_score_correction_bias`` float32 [E] when given) into ``topk_ids`` (int32 or int64)
    and their scores into ``topk_weights`` (float32), divided by their sum when
    ``renormalize``; ``token_expert_indices[t, k] = k * M + t`` (int32); the ids of the rows
    where ``is_padding`` (bool [M]) is True are -1.  M is ``gating_output``'s rows (the
    buffers may have more; those rows are left as they are).  Returns None."""
    if is_padding is None and token_expert_indices is not None and _route_call(
        gating_output, topk_weights, topk_ids, token_expert_indices, renormalize,
        e_score_correction_bias,
    ):  # fmt: skip
        return
    import torch

    _check_pair(topk_weights, topk_ids, "topk_ids")
    if not isinstance(token_expert_indices, torch.Tensor):
        raise TypeError("token_expert_indices must be a torch.Tensor")
    if token_expert_indices.shape != topk_weights.shape:
        raise ValueError(
            f"token_expert_indices must have topk_weights' shape {list(topk_weights.shape)}, "
            f"got {list(token_expert_indices.shape)}"
        )
    if token_expert_indices.dtype != torch.int32:
        raise TypeError(
            f"token_expert_indices must have dtype torch.int32, got {token_expert_indices.dtype}"
        )
    m = topk_weights.shape[0]
    if isinstance(gating_output, torch.Tensor) and gating_output.dim() == 2:
        m = min(m, gating_output.shape[0])  # vLLM's num_rows (more rows: the op refuses)
    if is_padding is not None:
        if not isinstance(is_padding, torch.Tensor) or is_padding.dtype != torch.bool:
            got = is_padding.dtype if isinstance(is_padding, torch.Tensor) else _kind(is_padding)
            raise TypeError(f"is_padding must be a torch.bool tensor, got {got}")
        if is_padding.shape != (m,) or is_padding.device != topk_ids.device:
            raise ValueError(
                f"is_padding must be [M] = [{m}] on {topk_ids.device}, got "
                f"{list(is_padding.shape)} on {is_padding.device}"
            )
        # Read after the gate has written: it must not share memory with what it writes.
        _no_overlap(
            {"topk_weights": topk_weights, "topk_ids": topk_ids,
             "token_expert_indices": token_expert_indices},
            {"is_padding": is_padding},
        )  # fmt: skip
        if torch.compiler.is_dynamo_compiling():
            # traced: no memory to compare here; the mask as it is before the gate writes
            is_padding = is_padding.clone()
    try:
        _route_into(gating_output, topk_weights, topk_ids, renormalize=renormalize,
                    correction_bias=_bias(e_score_correction_bias, "e_score_correction_bias"),
                    token_expert_indices=token_expert_indices)  # fmt: skip
    except (TypeError, ValueError) as e:
        raise renamed(e, _VLLM_SOFTMAX_NAMES) from None
    if is_padding is not None:
        topk_ids[:m].masked_fill_(is_padding[:, None], -1)


_VLLM_SCORING = {0: "none", 1: "sigmoid"}


def _scoring_code(scoring_func: Any) -> int:
    """vLLM's ``scoring_func`` as an int of ``_VLLM_SCORING`` (numpy ints too, as its
    schema's ``int``)."""
    from ..validation.ints import validate_int

    try:
        code = validate_int(scoring_func, "scoring_func")
    except TypeError:
        code = None
    if code not in _VLLM_SCORING:
        raise ValueError(f"scoring_func must be 0 (none) or 1 (sigmoid), got {scoring_func!r}")
    return code


def vllm_grouped_topk(
    scores: Tensor,
    num_expert_group: int,
    topk_group: int,
    topk: int,
    renormalize: bool,
    routed_scaling_factor: float,
    bias: Tensor,
    scoring_func: int = 0,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``_custom_ops.grouped_topk``: ``scoring_func`` 0 takes ``scores`` as the
    scores, 1 their sigmoid; choice = score + ``bias``; groups scored by their two largest
    choices, ``topk_group`` kept, the ``topk`` largest choices chosen; weights = scores,
    renormalised when ``renormalize``, times ``routed_scaling_factor``.  Returns
    ``(topk_weights float32, topk_ids int32)`` ``[M, topk]``."""
    if type(scoring_func) is not int or scoring_func not in _VLLM_SCORING:
        scoring_func = _scoring_code(scoring_func)
    if bias is None or num_expert_group is None or topk_group is None:
        _required(bias=bias, num_expert_group=num_expert_group, topk_group=topk_group)
    out = _route_alloc(scores, topk, 2 - scoring_func, renormalize, bias, num_expert_group,
                       topk_group, routed_scaling_factor)  # fmt: skip
    if out is not None:
        return out
    try:
        return _ops().moe_route(
            scores, topk, scoring=_VLLM_SCORING[scoring_func], renormalize=renormalize,
            num_expert_group=num_expert_group, topk_group=topk_group,
            correction_bias=_bias(bias, "bias"), routed_scaling_factor=routed_scaling_factor,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise renamed(e, _caller_names("scores", correction_bias="bias")) from None


# ---------------------------------------------------------------------------- SGLang
def sglang_topk_softmax(
    topk_weights: Tensor, topk_ids: Tensor, gating_output: Tensor, renormalize: bool = False
) -> None:
    """sgl-kernel's ``topk_softmax``: as vLLM's without ``token_expert_indices``."""
    if _route_call(gating_output, topk_weights, topk_ids, None, renormalize, None):
        return
    _check_pair(topk_weights, topk_ids, "topk_ids")
    try:
        _route_into(gating_output, topk_weights, topk_ids, renormalize=renormalize)
    except (TypeError, ValueError) as e:
        raise renamed(e, _caller_names("gating_output")) from None


_FUSED_SCORING = {"softmax": 0, "sigmoid": 1}  # moe_fused_gate's common spellings: op codes


def sglang_moe_fused_gate(
    input_tensor: Tensor,
    bias: Tensor | None,
    num_expert_group: int,
    topk_group: int,
    topk: int,
    renormalize: bool = True,
    scoring_func: str = "sigmoid",
    num_fused_shared_experts: int = 0,
    routed_scaling_factor: float = 0,
    apply_routed_scaling_factor_on_output: bool = False,
) -> tuple[Tensor, Tensor]:
    """sgl-kernel's ``moe_fused_gate``: sigmoid (or softmax) scores, choice = score + bias
    (a zero bias when None: the groups are always scored by their two largest choices),
    ``topk_group`` groups kept, ``topk`` chosen, renormalised when ``renormalize``; the
    weights are multiplied by ``routed_scaling_factor`` only with
    ``apply_routed_scaling_factor_on_output``.  Fused shared experts are not supported.
    Returns ``(topk_weights float32, topk_ids int32)`` ``[M, topk]``."""
    if num_expert_group is None or topk_group is None:
        _required(num_expert_group=num_expert_group, topk_group=topk_group)
    fused = type(scoring_func) is str and scoring_func in _FUSED_SCORING
    apply = apply_routed_scaling_factor_on_output
    if (
        bias is not None
        and type(num_fused_shared_experts) is int
        and num_fused_shared_experts == 0
        and fused
        and (apply is True or apply is False)
        and (type(routed_scaling_factor) is float or type(routed_scaling_factor) is int)
    ):
        out = _route_alloc(
            input_tensor, topk, _FUSED_SCORING[scoring_func], renormalize, bias, num_expert_group,
            topk_group, routed_scaling_factor if apply else 1.0,
        )  # fmt: skip
        if out is not None:
            return out
    import torch

    _fused_gate_options(scoring_func, apply, routed_scaling_factor, num_fused_shared_experts)
    if bias is None and isinstance(input_tensor, torch.Tensor) and input_tensor.dim() == 2:
        bias = torch.zeros(input_tensor.shape[1], dtype=torch.float32, device=input_tensor.device)
    scale = routed_scaling_factor if apply_routed_scaling_factor_on_output else 1.0
    try:
        return _ops().moe_route(
            input_tensor, topk, scoring=scoring_func.lower(), renormalize=renormalize,
            num_expert_group=num_expert_group, topk_group=topk_group,
            correction_bias=_bias(bias, "bias"), routed_scaling_factor=scale,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise renamed(e, _caller_names("input_tensor", correction_bias="bias")) from None


# ----------------------------------------------------------------------------- AITER
def aiter_biased_grouped_topk(
    gating_output: Tensor,
    correction_bias: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    num_expert_group: int,
    topk_group: int,
    need_renorm: bool,
    routed_scaling_factor: float = 1.0,
) -> None:
    """AITER's ``biased_grouped_topk``: sigmoid scores, choice = score + ``correction_bias``,
    groups scored by their two largest choices, ``topk_group`` kept, ``topk`` =
    ``topk_weights.shape[1]`` chosen into ``topk_weights`` / ``topk_ids``, renormalised when
    ``need_renorm``, times ``routed_scaling_factor``.  Returns None."""
    if correction_bias is None or num_expert_group is None or topk_group is None:
        _required(
            correction_bias=correction_bias, num_expert_group=num_expert_group,
            topk_group=topk_group,
        )  # fmt: skip
    if _route_call(
        gating_output, topk_weights, topk_ids, None, need_renorm, correction_bias, sigmoid=True,
        groups=num_expert_group, topk_group=topk_group, scale=routed_scaling_factor,
    ):  # fmt: skip
        return
    _check_pair(topk_weights, topk_ids, "topk_ids")
    try:
        _route_into(
            gating_output, topk_weights, topk_ids, scoring="sigmoid",
            renormalize=need_renorm, num_expert_group=num_expert_group, topk_group=topk_group,
            correction_bias=_bias(correction_bias, "correction_bias"),
            routed_scaling_factor=routed_scaling_factor,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise renamed(e, _caller_names("gating_output", renormalize="need_renorm")) from None
