"""The router of a MoE model as ``moe_route`` options, from its Hugging Face ``config.json``.

:func:`router_from_config` is the one place that maps a config's router fields to the
options of :func:`aiter_aux.moe_route`; ``aiter-aux run`` and ``examples/moe_layer.py`` route
their random router logits with it.  The rules, each recorded as a line of
:attr:`Router.steps`:

* ``scoring``: ``scoring_func`` (``softmax`` or ``sigmoid``); absent, the architecture's
  (:data:`ARCH_SCORING`: GLM-4.5 and Llama-4 score by sigmoid in code), else ``softmax``.
  Another ``scoring_func`` (DeepSeek-V4's ``sqrtsoftplus``) is refused.
* ``correction_bias``: the model has ``e_score_correction_bias`` when ``topk_method`` is
  ``noaux_tc`` (DeepSeek-V3, Kimi-K2) or its architecture always has one (GLM-4.5); the bias
  is a weight of the checkpoint, so a run draws one (fp32 ``[E]``).
* ``renormalize``: ``norm_topk_prob``; absent, the architecture's (:data:`ARCH_RENORMALIZE`:
  Mixtral and gpt-oss renormalise in code, Llama-4 does not), else True (moe_route's
  default).
* groups: ``n_group`` and ``topk_group`` when ``n_group > 1`` and ``topk_method`` is not
  ``greedy``; ``n_group`` 1 (Kimi-K2, GLM-4.5) keeps every expert: no groups.
* ``routed_scaling_factor``: the config's, else 1.0.

Routers that moe_route computes by another route to the same math (:attr:`Router.notes`):
gpt-oss takes the top-k of the logits, then the softmax over the k selected: that is the
softmax over all experts renormalised over the selected (``exp(l_i - m) / sum_sel exp(l_j -
m)``, ``m`` the row's largest logit, which is selected), so ``softmax`` + ``renormalize``
gives the same ids and weights within a few fp32 roundings (two divisions instead of one);
the ids differ only where two scores round to one value (scores that underflow to 0,
logits within one fp32 rounding), which moe_route breaks to the lower id.  Llama-4 takes the
top-1 logit and the sigmoid of it: ``sigmoid`` without ``renormalize``, the same up to the
sigmoid's rounding and ties of saturated scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model_config import EXPERT_KEYS, ModelConfigError, model_name

#: ``scoring_func`` values moe_route computes.
SCORINGS = ("softmax", "sigmoid")
#: Architectures whose scoring function is fixed in code (no ``scoring_func`` key).
ARCH_SCORING = {"glm4_moe": "sigmoid", "llama4": "sigmoid", "llama4_text": "sigmoid"}
#: Architectures that always have ``e_score_correction_bias`` (no ``topk_method`` key).
ARCH_BIAS = ("glm4_moe",)
#: Architectures whose renormalisation is fixed in code (no ``norm_topk_prob`` key).
ARCH_RENORMALIZE = {"mixtral": True, "gpt_oss": True, "llama4": False, "llama4_text": False}
#: Architectures whose router moe_route cannot compute, and why.
ARCH_UNSUPPORTED = {
    "deepseek_v4": "DeepSeek-V4 scores by sqrt(softplus(logit)) and hash-routes its first "
    "layers; moe_route computes softmax and sigmoid scores",
}
#: Notes on routers moe_route computes by another route to the same math (module docstring).
ARCH_NOTES = {
    "gpt_oss": "gpt-oss takes the softmax over its top-k logits: moe_route's softmax + "
    "renormalize is the same math (ids equal but for scores that round to one value; "
    "weights within a few fp32 roundings)",
    "llama4_text": "Llama-4 applies sigmoid to its top-k logits: moe_route's sigmoid without "
    "renormalize is the same math (ids equal but for saturated scores that tie)",
}


@dataclass(frozen=True)
class Router:
    """A model's router as moe_route options; ``correction_bias`` says whether the model has
    a bias (a tensor the caller supplies), ``steps`` how each option was derived."""

    model: str
    scoring: str = "softmax"
    renormalize: bool = True
    num_expert_group: int | None = None
    topk_group: int | None = None
    correction_bias: bool = False
    routed_scaling_factor: float = 1.0
    steps: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def options(self, correction_bias=None) -> dict:
        """The keyword arguments of moe_route; ``correction_bias`` the tensor when the model
        has one (a ValueError if it is missing or not wanted)."""
        if (correction_bias is not None) != self.correction_bias:
            want = "needs" if self.correction_bias else "has no"
            raise ValueError(f"the router of {self.model} {want} a correction_bias")
        return dict(scoring=self.scoring, renormalize=self.renormalize,
                    num_expert_group=self.num_expert_group, topk_group=self.topk_group,
                    correction_bias=correction_bias,
                    routed_scaling_factor=self.routed_scaling_factor)  # fmt: skip

    def describe(self) -> str:
        """One line: the moe_route options (``bias`` for a correction bias)."""
        parts = [self.scoring, "renormalize" if self.renormalize else "no renormalize"]
        if self.num_expert_group:
            parts.append(f"groups {self.topk_group} of {self.num_expert_group}")
        if self.correction_bias:
            parts.append("correction bias")
        if self.routed_scaling_factor != 1.0:
            parts.append(f"scaling {self.routed_scaling_factor:g}")
        return f"{self.model} ({', '.join(parts)})"


#: The router of a model whose config names none: moe_route's defaults.
DEFAULT_ROUTER = Router("default", steps=("moe_route's defaults: softmax, renormalize",))


def _section(config: Mapping) -> Mapping:
    """The section holding the MoE keys, as :func:`aiter_aux.model_config.shapes_from_config`
    reads it (``text_config`` when it has the expert count)."""
    text = config.get("text_config")
    nested = isinstance(text, Mapping) and any(text.get(k) is not None for k in EXPERT_KEYS)
    return text if nested else config


def router_from_config(config: Mapping, name: str | None = None) -> Router:
    """The router of ``config`` (a parsed ``config.json``) by the module docstring's rules;
    :class:`ModelConfigError` for a router moe_route cannot compute or a bad field."""
    section = _section(config)
    arch = section.get("model_type") or config.get("model_type")
    model = name or model_name(config)
    if arch in ARCH_UNSUPPORTED:
        raise ModelConfigError(f"{model}: {ARCH_UNSUPPORTED[arch]}")
    steps = []

    scoring = section.get("scoring_func")
    if scoring is None:
        scoring = ARCH_SCORING.get(arch, "softmax")
        why = f"model_type {arch} scores by {scoring}" if arch in ARCH_SCORING else "default"
        steps.append(f"scoring: {scoring} (no scoring_func; {why})")
    elif scoring in SCORINGS:
        steps.append(f"scoring: scoring_func = {scoring}")
    else:
        raise ModelConfigError(f"{model}: scoring_func {scoring!r} is not one moe_route "
                               f"computes ({', '.join(SCORINGS)})")  # fmt: skip

    method = section.get("topk_method")
    bias = method == "noaux_tc" or arch in ARCH_BIAS
    if bias:
        why = "topk_method = noaux_tc" if method == "noaux_tc" else f"model_type {arch}"
        steps.append(f"correction bias: e_score_correction_bias ({why})")

    norm = section.get("norm_topk_prob")
    if norm is None:
        renormalize = ARCH_RENORMALIZE.get(arch, True)
        why = f"model_type {arch}" if arch in ARCH_RENORMALIZE else "default"
        steps.append(f"renormalize: {renormalize} (no norm_topk_prob; {why})")
    elif isinstance(norm, bool):
        renormalize = norm
        steps.append(f"renormalize: norm_topk_prob = {str(norm).lower()}")
    else:
        raise ModelConfigError(f"{model}: norm_topk_prob must be true or false, got {norm!r}")

    groups, kept = section.get("n_group"), section.get("topk_group")
    for key, v in (("n_group", groups), ("topk_group", kept)):
        if v is not None and (type(v) is not int or v < 1):
            raise ModelConfigError(f"{model}: {key} must be a positive integer, got {v!r}")
    if groups is None or groups == 1 or method == "greedy":
        why = "topk_method = greedy" if method == "greedy" and groups else (
            f"n_group = {groups}: every expert kept" if groups else "no n_group")  # fmt: skip
        steps.append(f"groups: none ({why})")
        groups = kept = None
    else:
        if kept is None:
            raise ModelConfigError(f"{model}: n_group = {groups} without topk_group")
        steps.append(f"groups: n_group = {groups}, topk_group = {kept}")

    scale = section.get("routed_scaling_factor")
    if scale is None:
        scale = 1.0
    elif type(scale) not in (int, float) or not 0 < scale < float("inf"):
        raise ModelConfigError(f"{model}: routed_scaling_factor must be a positive number, "
                               f"got {scale!r}")  # fmt: skip
    else:
        steps.append(f"routed_scaling_factor = {scale:g}")
    notes = (ARCH_NOTES[arch],) if arch in ARCH_NOTES else ()
    return Router(model, scoring, renormalize, groups, kept, bias, float(scale),
                  tuple(steps), notes)  # fmt: skip


def router_for(text: str) -> Router:
    """The router named by ``text``: ``default``, a shipped model (``aiter-aux list
    --models`` names) or the path of a ``config.json``."""
    from .model_config import load_config, shipped_configs

    if text == "default":
        return DEFAULT_ROUTER
    configs = shipped_configs()
    by_name = {k.lower(): (k, c) for k, c in configs.items()}
    if text.lower() in by_name:
        name, config = by_name[text.lower()]
        return router_from_config(config, name)
    if "/" in text or text.endswith(".json"):
        return router_from_config(load_config(text))
    raise ModelConfigError(f"--router {text!r}: not a shipped model ({', '.join(configs)}), "
                           "'default' or a config.json path")  # fmt: skip


def router_of_shape(shape) -> tuple[Router, str]:
    """``(router, where)``: the router of a shipped model whose layout without EP ``shape``
    serves and whose router moe_route computes: the model the catalog's comment of the
    shape names when several serve it (two models can share a layout), else the first
    (``where``: model and layout, and the other models that serve it); else
    :data:`DEFAULT_ROUTER` (``where`` says why)."""
    from .model_config import layout_name, models_served, shipped_configs

    configs = shipped_configs()
    skipped, found = [], []
    for s in models_served([tuple(shape)], configs, eps=()):
        try:
            found.append((router_from_config(configs[s.model], s.model), s))
        except ModelConfigError as e:
            skipped.append(str(e))
    if not found:
        why = "no shipped model config serves this shape"
        return DEFAULT_ROUTER, why + (f" ({skipped[0]})" if skipped else "")
    comment = _catalog_comment(shape)
    router, s = next((f for f in found if comment.startswith(f[1].model + " ")), found[0])
    fused = ", shared expert fused" if s.fused_shared else ""
    where = f"{s.model} {layout_name(s.tp, s.ep)}{fused} serves this shape"
    others = sorted({f[1].model for f in found} - {s.model})
    if others:
        where += f" (so does {', '.join(others)}: --router MODEL picks another)"
    return router, where


def _catalog_comment(shape) -> str:
    """The catalog line's comment of ``shape`` ("" when none or the catalog is unreadable)."""
    from .catalog_edit import default_files, read_entries
    from .shapes import round_inter

    e, d, i, k = (int(v) for v in shape)
    try:
        comments = {x.shape: x.comment for x in read_entries(default_files()[0])}
    except (OSError, ValueError):
        return ""
    return comments.get((e, d, round_inter(i), k), "") or ""
