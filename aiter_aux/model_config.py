"""The catalog shape of a MoE model, derived from its Hugging Face ``config.json``.

:func:`shapes_from_config` turns a config and a parallel layout (TP, EP) into the catalog
tuple ``(expert, model_dim, inter_rounded, topk)`` and records every step as a line of
text, so that ``aiter-aux add-shape --from-config`` can say how it got there.  The rules,
each stated in the derivation it applies to:

* **Keys.**  Routed experts: ``n_routed_experts`` (DeepSeek, Kimi, GLM),
  ``num_local_experts`` (gpt-oss, Mixtral, Llama-4) or ``num_experts`` (Qwen); top-k:
  ``num_experts_per_tok``, ``experts_per_token`` or ``num_experts_per_token``; per-expert
  inter: ``moe_intermediate_size``, else ``intermediate_size``; ``hidden_size``.  A
  ``text_config`` holding the expert count (Llama-4, Kimi-K2.5, Qwen3.5) is read instead of
  the top level.  The first key present wins; ``null`` counts as absent.
* **Shared expert.**  Exactly one shared expert of the routed experts' inter size
  (``n_shared_experts = 1``, or ``shared_expert_intermediate_size`` equal to
  ``moe_intermediate_size``) is fused as one more expert: E + 1 and topk + 1.  Any other
  shared expert (two or more, another size, or Llama-4's, whose routed experts take the
  router weight on their input) stays a dense MLP outside the MoE.  ``fuse_shared``
  overrides the default (True is refused where fusion is impossible).  Under EP the
  default is not fused (as the catalog's EP lines); fused, each rank holds the shared expert
  as one more local expert (E = E_local + 1).
* **TP / EP.**  EP splits the routed experts (``E_local = E / EP``, exact) and never inter.
  When EP >= TP the EP ranks are the TP ranks (vLLM ``--enable-expert-parallel``) and inter
  is not split; when EP < TP the EP groups are carved out of the TP ranks (SGLang
  ``--ep-size``) and inter is split over TP / EP.  Without EP, TP splits inter.  The split
  must be exact; the result is rounded up to a multiple of 256 (the catalog's form).
* **model_dim.**  A hidden size that is not a multiple of 256 (gpt-oss: 2880) is padded to
  the next one (3072), the rule of moe_sort_scales (the strictest of the ops'); the caller
  pads the activations.
* **Limits.**  ``E <= MAX_EXPERTS``, ``1 <= topk <= min(E, MAX_TOPK)``, the padded
  model_dim ``<= MAX_MODEL_DIM`` and inter_rounded ``<= MAX_INTER``: the catalog's rule
  constants, read from ``codegen/catalog.py``.

Errors are :class:`ModelConfigError` (a ``ValueError``) with a one-line message; reading a
config is bounded (:func:`load_config`: a regular file of at most
:data:`MAX_CONFIG_BYTES`, opened non-blocking, every parse failure naming the file).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .shapes import Shape, round_inter

EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token")
INTER_KEYS = ("moe_intermediate_size", "intermediate_size")
HIDDEN_KEYS = ("hidden_size",)
SHARED_COUNT_KEYS = ("n_shared_experts", "num_shared_experts")
SHARED_SIZE_KEYS = ("shared_expert_intermediate_size",)
#: model_type values whose MoE block always has one shared expert of the routed size, which
#: no config key names (transformers' Llama4TextMoe.shared_expert).
BUILTIN_SHARED = ("llama4", "llama4_text")
DEFAULT_TPS = (1, 2, 4, 8)
DEFAULT_EPS = (2, 4, 8)
#: The shipped configs (package data): trimmed ``config.json`` files of public MoE models,
#: their sources in the README next to them.
CONFIG_DIR = Path(__file__).resolve().parent / "data" / "model_configs"


class ModelConfigError(ValueError):
    """A config this derivation cannot read, or a layout that does not fit it."""


def _rules():
    """``codegen/catalog.py``: the catalog's rule constants (INTER_ALIGN, MODEL_DIM_ALIGN,
    MAX_EXPERTS, MAX_TOPK)."""
    from .jit.paths import codegen_module

    return codegen_module("catalog")


def layout_name(tp: int, ep: int) -> str:
    """``TP4``, ``EP8`` (EP over as many TP ranks, or TP 1) or ``TP8 EP2``."""
    if ep == 1:
        return f"TP{tp}"
    return f"EP{ep}" if tp in (1, ep) else f"TP{tp} EP{ep}"


@dataclass(frozen=True)
class Derivation:
    """One model at one layout: ``shape``, how it was derived (``steps``, in order) and what
    the caller must do or know (``notes``, e.g. padding)."""

    model: str
    tp: int
    ep: int
    shape: Shape
    fused_shared: bool
    fusable_shared: bool  # one shared expert of the routed size that can be fused
    hidden: int  # hidden_size as the config gives it (shape[1] is padded)
    inter: int  # per-expert inter before the split
    inter_key: str
    moe_tp: int  # the ranks that split inter
    routed_experts: int
    steps: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def layout(self) -> str:
        return layout_name(self.tp, self.ep)

    @property
    def comment(self) -> str:
        """The catalog comment: model, layout, and the arithmetic behind the tuple."""
        return self.comments()[0]

    def comments(self) -> tuple[str, str, str]:
        """The catalog comment, longest first: :attr:`comment`; the same without the
        per-rank inter before rounding (``inter 2880 / 4 -> 768``); model and layout only."""
        head = f"{self.model} {self.layout}"
        if self.fusable_shared:
            head += f", shared expert {'fused' if self.fused_shared else 'not fused'}"
        parts = [f"{self.routed_experts} / {self.ep} local experts"] if self.ep > 1 else []
        if self.shape[1] != self.hidden:
            parts.append(f"hidden {self.hidden} padded to {self.shape[1]}")
        split = "moe_inter" if self.inter_key == "moe_intermediate_size" else "inter"
        split += f" {self.inter}"
        if self.moe_tp > 1:
            split += f" / {self.moe_tp}"
        full = short = split
        per_rank = self.inter // self.moe_tp
        if per_rank != self.shape[2]:
            full += (f" = {per_rank}" if self.moe_tp > 1 else "") + f" -> {self.shape[2]}"
            short += f" -> {self.shape[2]}"
        return (
            f"{head} ({'; '.join(parts + [full])})",
            f"{head} ({'; '.join(parts + [short])})",
            head,
        )


class Served(NamedTuple):
    """A model at a layout whose shape is in the catalog."""

    model: str
    tp: int
    ep: int
    fused_shared: bool
    shape: Shape


MAX_CONFIG_BYTES = 1 << 20  # a Hugging Face config.json is a few kB
MAX_NAME_CHARS = 128  # a Hugging Face repo name has at most 96


def _read_bounded(path: str | Path) -> bytes:
    """The bytes of the regular file ``path`` (at most :data:`MAX_CONFIG_BYTES`), opened
    non-blocking so that a FIFO or a device is refused, never waited on or read forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ModelConfigError(f"cannot read {path}: {e.strerror or e}") from None
    st = os.fstat(fd)  # before fdopen, which refuses a directory naming only the fd
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        from .jit.paths import file_kind

        raise ModelConfigError(f"cannot read {path}: not a regular file ({file_kind(st.st_mode)})")
    with os.fdopen(fd, "rb", buffering=0) as f:
        too_big = f"cannot read {path}: over {MAX_CONFIG_BYTES} bytes (a config.json is a few kB)"
        if st.st_size > MAX_CONFIG_BYTES:
            raise ModelConfigError(too_big)
        try:
            data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise ModelConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:  # it grew since the fstat
        raise ModelConfigError(too_big)
    return data


def load_config(path: str | Path) -> dict:
    """The JSON object in ``path``; :class:`ModelConfigError` (one line naming ``path``) for
    a missing, unreadable or non-regular file, one over :data:`MAX_CONFIG_BYTES`, bytes that
    are not UTF-8, invalid or too deeply nested JSON, an integer of more digits than Python
    converts, a JSON value that is not an object, or a model name (:func:`model_name`) with
    control or bidi characters or lone surrogates or over :data:`MAX_NAME_CHARS`."""
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path} is not UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise ModelConfigError(f"{path}: JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer over sys.get_int_max_str_digits() digits
        reason = str(e).split(";")[0]
        raise ModelConfigError(f"{path} cannot be read as JSON: {reason}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path} holds a JSON {type(config).__name__}, not an object")
    from .catalog_edit import text_error  # the rule of a catalog comment, which it becomes

    why = text_error(model_name(config), MAX_NAME_CHARS)
    if why:
        raise ModelConfigError(f"{path}: the model name (_source, _name_or_path or model_type) "
                               f"{why}")  # fmt: skip
    return config


def shipped_configs() -> dict[str, dict]:
    """The configs of :data:`CONFIG_DIR`, by model name (:func:`model_name`), in file order."""
    configs = {}
    for path in sorted(CONFIG_DIR.glob("*.json")):
        config = load_config(path)
        configs[model_name(config)] = config
    return configs


def model_name(config: Mapping) -> str:
    """The last part of ``_source`` or ``_name_or_path`` (a Hugging Face repo id), else the
    ``model_type``."""
    for key in ("_source", "_name_or_path"):
        value = config.get(key)
        if isinstance(value, str) and value.strip("/"):
            return value.rstrip("/").rsplit("/", 1)[-1]
    return str(config.get("model_type") or "model")


def _first(section: Mapping, keys: tuple[str, ...], where: str, synonyms: bool = True):
    """(key, value, notes) of the first key of ``keys`` present in ``section``, or None.
    For ``synonyms``, the notes name later keys that disagree with it."""
    present = []
    for key in keys:
        value = section.get(key)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            raise ModelConfigError(f"{where}{key} must be a non-negative integer, got {value!r}")
        present.append((key, value))
    if not present:
        return None
    key, value = present[0]
    notes = [
        f"{where}{k} = {v} disagrees with {where}{key} = {value}; {key} is used"
        for k, v in present[1:]
        if synonyms and v != value
    ]
    return key, value, notes


def _read(config: Mapping):
    """(section, where, fields, notes): the section holding the MoE keys ('' or
    'text_config.'), and (key, value) of routed experts, topk, inter and hidden."""
    text = config.get("text_config")
    nested = isinstance(text, Mapping) and any(text.get(k) is not None for k in EXPERT_KEYS)
    section, where = (text, "text_config.") if nested else (config, "")
    fields, notes, missing = {}, [], []
    for label, keys in (
        ("routed experts", EXPERT_KEYS),
        ("topk", TOPK_KEYS),
        ("inter", INTER_KEYS),
        ("hidden", HIDDEN_KEYS),
    ):
        found = _first(section, keys, where, synonyms=keys is not INTER_KEYS)
        if found is None:
            missing.append(f"no {label} (looked for {', '.join(keys)})")
        elif found[1] == 0:
            raise ModelConfigError(f"{where}{found[0]} is 0: not a MoE layer")
        else:
            fields[label] = found[:2]
            notes += found[2]
    if missing:
        model_type = section.get("model_type") or config.get("model_type") or "no model_type"
        scope = "the config (top level or text_config)" if "text_config" in config else "the config"
        raise ModelConfigError(
            f"not a MoE config this derivation reads ({model_type}): {scope} has "
            + "; ".join(missing)
        )
    return section, where, fields, notes


def _shared_expert(section, where, inter, inter_key):
    """(count, size, line, notes, notes_if_fused, blocker): the shared expert(s), count 0
    when there is none; blocker the reason one of the routed size cannot be fused."""
    found = _first(section, SHARED_COUNT_KEYS, where)
    if found is not None and found[1] > 0:
        key, count, notes = found
        total = f" (one MLP of {count} x {inter} = {count * inter})" if count > 1 else ""
        line = f"shared experts: {where}{key} = {count}, each of {inter_key} {inter}{total}"
        return count, inter, line, notes, [], None
    found = _first(section, SHARED_SIZE_KEYS, where)
    if found is not None and found[1] > 0:
        key, size, notes = found
        gate = (
            "the shared expert's output is scaled by sigmoid(shared_expert_gate(x)) "
            "(Qwen-style MoE): pass that gate as the fused slot's topk_weight"
        )
        return 1, size, f"shared expert: {where}{key} = {size}", notes, [gate], None
    model_type = section.get("model_type")
    if model_type in BUILTIN_SHARED:
        line = (
            f"shared expert: model_type {model_type} always has one, of {inter_key} {inter} "
            "(no config key names it)"
        )
        note = (
            "Llama-4 applies the router weight (top-1) to the expert input, not its output: "
            "scale each token row by its weight before the quant and pass topk_weights of 1"
        )
        blocker = (
            "the routed experts take the router weight on their input (Llama-4), and a "
            "token's one quantised row cannot feed the shared expert unscaled"
        )
        return 1, inter, line, [note], [], blocker
    return 0, 0, "shared experts: none", [], [], None


def _fuse(count, size, inter, inter_key, ep, fuse_shared, blocker) -> tuple[bool, str]:
    """(fused, line): whether the shared expert is fused, and why."""
    fusable = count == 1 and size == inter and blocker is None
    if count == 0:
        why = "the model has no shared expert"
    elif count > 1:
        why = f"{count} shared experts are not one expert of the routed size"
    elif size != inter:
        why = f"its inter {size} is not the routed experts' {inter_key} {inter}"
    else:
        why = blocker
    if fuse_shared and not fusable:
        raise ModelConfigError(
            f"cannot fuse the shared expert: {why}; only one shared expert of the routed "
            "experts' size, fed the same rows, can be fused (drop --fuse-shared)"
        )
    if count == 0:
        return False, ""
    if not fusable:
        return False, f"shared expert not fused: {why}; it stays a dense MLP outside the MoE"
    if fuse_shared is False:
        return False, "shared expert not fused (fuse_shared=False): a dense MLP outside the MoE"
    if fuse_shared is None and ep > 1:
        return False, (
            f"shared expert not fused under EP {ep} (the default): each rank runs it as a "
            "dense MLP; fuse_shared=True makes it one more local expert (E_local + 1)"
        )
    how = "fuse_shared=True" if fuse_shared else "one shared expert of the routed size"
    return True, f"shared expert fused as one more expert: E + 1, topk + 1 ({how})"


def _moe_tp(tp: int, ep: int) -> tuple[int, str]:
    """(moe_tp, line): how many ranks split inter, and why."""
    if ep == 1:
        return tp, "TP 1: inter not split" if tp == 1 else f"TP {tp} splits inter"
    if ep % tp == 0:
        return 1, (
            f"EP {ep} >= TP {tp}: the EP ranks are the TP ranks (vLLM "
            "--enable-expert-parallel); EP does not split inter"
        )
    if tp % ep == 0:
        return tp // ep, (
            f"EP {ep} < TP {tp}: EP groups carved out of the TP ranks (SGLang --ep-size) "
            f"split inter over TP / EP = {tp // ep}"
        )
    raise ModelConfigError(f"EP {ep} and TP {tp}: one must divide the other")


def shapes_from_config(
    config: Mapping,
    tp: int,
    ep: int = 1,
    fuse_shared: bool | None = None,
    *,
    name: str | None = None,
) -> Derivation:
    """The catalog shape of the MoE layer of ``config`` (a parsed ``config.json``) at ``tp``
    and ``ep``.  ``fuse_shared`` None applies the rule of the module docstring; True and
    False force it.  ``name`` overrides :func:`model_name`."""
    for what, value in (("tp", tp), ("ep", ep)):
        if type(value) is not int or value < 1:
            raise ModelConfigError(f"{what} must be a positive integer, got {value!r}")
    moe_tp, why_split = _moe_tp(tp, ep)
    rules = _rules()
    section, where, fields, notes = _read(config)
    (e_key, experts), (k_key, topk) = fields["routed experts"], fields["topk"]
    (i_key, inter), (h_key, hidden) = fields["inter"], fields["hidden"]
    steps = ["reading text_config (the language model of a multimodal config)"] if where else []

    steps.append(f"routed experts: {where}{e_key} = {experts}")
    other = "intermediate_size" if i_key == "moe_intermediate_size" else "intermediate_size_mlp"
    why = f" ({where}{other} {section[other]} is the dense MLP's)" if section.get(other) else ""
    if i_key == "intermediate_size" and not why:
        why = " (there is no moe_intermediate_size: intermediate_size is the experts')"
    steps.append(f"inter per expert: {where}{i_key} = {inter}{why}")

    count, size, line, shared_notes, fused_notes, blocker = _shared_expert(
        section, where, inter, i_key
    )
    steps.append(line)
    fused, decision = _fuse(count, size, inter, i_key, ep, fuse_shared, blocker)
    steps += [decision] if decision else []
    notes += shared_notes + (fused_notes if fused else [])

    if experts % ep:
        raise ModelConfigError(f"EP {ep} does not divide the {experts} routed experts")
    local = experts // ep
    if ep > 1:
        steps.append(f"EP {ep} splits the routed experts: {experts} / {ep} = {local} local")
    e_total, k_total = local + fused, topk + fused
    held = "local" if ep > 1 else "routed"
    steps.append(f"E = {local} {held} + 1 fused shared = {e_total}" if fused else f"E = {local}")
    fused_k = f" + 1 fused shared = {k_total}" if fused else ""
    steps.append(f"topk: {where}{k_key} = {topk}{fused_k}")

    align = rules.MODEL_DIM_ALIGN
    model_dim = -(-hidden // align) * align
    if model_dim > rules.MAX_MODEL_DIM:
        padded = f" (padded to a multiple of {align}: {model_dim})" if model_dim != hidden else ""
        raise ModelConfigError(
            f"{where}{h_key} {hidden}{padded} is over the model_dim {rules.MAX_MODEL_DIM} the "
            "kernels compile: no padding serves it"
        )
    if model_dim != hidden:
        steps.append(
            f"pad hidden {hidden} -> {model_dim}: moe_sort_scales needs model_dim % {align} "
            "== 0; pad the activations"
        )
        notes.append(
            f"model_dim {model_dim} is {where}{h_key} {hidden} padded: pad the activations "
            f"(and the weights' model_dim) with zeros to {model_dim}"
        )
    else:
        steps.append(f"model_dim: {where}{h_key} = {hidden} (a multiple of {align})")

    if inter % moe_tp:
        raise ModelConfigError(
            f"{'TP' if ep == 1 else 'TP / EP ='} {moe_tp} does not divide {where}{i_key} "
            f"{inter} ({inter} / {moe_tp} = {inter / moe_tp:g})"
        )
    per_rank = inter // moe_tp
    steps.append(f"{why_split}: {inter} / {moe_tp} = {per_rank}" if moe_tp > 1 else why_split)
    inter_rounded = round_inter(per_rank)
    if inter_rounded > rules.MAX_INTER:
        raise ModelConfigError(
            f"{where}{i_key} {inter}: inter per rank {per_rank} rounds up to {inter_rounded}, "
            f"over the inter_rounded {rules.MAX_INTER} a catalog shape may have"
        )
    if inter_rounded != per_rank:
        steps.append(
            f"round inter {per_rank} up to {inter_rounded} (the catalog stores inter rounded "
            f"up to a multiple of {rules.INTER_ALIGN})"
        )
    else:
        steps.append(f"inter_rounded = {inter_rounded} (a multiple of {rules.INTER_ALIGN})")

    if e_total > rules.MAX_EXPERTS:
        raise ModelConfigError(
            f"E = {e_total} exceeds the {rules.MAX_EXPERTS} experts a catalog shape may have"
            + ("; use EP, or do not fuse the shared expert" if fused else "; use EP")
        )
    if k_total > min(e_total, rules.MAX_TOPK):
        limit = f"E = {e_total}" if e_total < rules.MAX_TOPK else f"{rules.MAX_TOPK}"
        raise ModelConfigError(
            f"topk {k_total} exceeds {limit} (a catalog shape needs "
            f"1 <= topk <= min(E, {rules.MAX_TOPK}))"
            + (f"; EP {ep} leaves {local} local experts" if ep > 1 else "")
        )
    steps.append(
        f"limits: E {e_total} <= {rules.MAX_EXPERTS}, topk {k_total} <= min(E, {rules.MAX_TOPK})"
    )
    shape = (e_total, model_dim, inter_rounded, k_total)
    steps.append(f"shape: {shape}")
    return Derivation(
        model=name or model_name(config),
        tp=tp,
        ep=ep,
        shape=shape,
        fused_shared=bool(fused),
        fusable_shared=count == 1 and size == inter and blocker is None,
        hidden=hidden,
        inter=inter,
        inter_key=i_key,
        moe_tp=moe_tp,
        routed_experts=experts,
        steps=tuple(steps),
        notes=tuple(notes),
    )


def format_derivation(d: Derivation) -> list[str]:
    """Printable lines: the steps, the notes and the catalog line to add."""
    lines = [f"{d.model} at {d.layout}:"]
    lines += [f"  {step}" for step in d.steps]
    lines += [f"  note: {note}" for note in d.notes]
    lines.append(f"catalog line: {d.shape},  # {d.comment}")
    return lines


def models_served(
    catalog_shapes: Iterable | None,
    configs: Mapping[str, Mapping] | Iterable[Mapping],
    tps: Iterable[int] = DEFAULT_TPS,
    eps: Iterable[int] = DEFAULT_EPS,
    accept=None,
) -> list[Served]:
    """The models and layouts whose shape is in ``catalog_shapes`` (inter rounded here), or,
    with ``catalog_shapes=None``, whose shape ``accept(shape)`` takes (e.g. every shape an
    instance can be built for).  ``configs`` maps a model name to its config, or is a list
    of configs named by :func:`model_name`.  Layouts: each TP of ``tps`` without EP, and
    each EP of ``eps`` over as many TP ranks; fused and not fused where the shared expert
    can be fused.  A layout a model does not fit (an EP that does not divide its experts,
    ...) is skipped."""
    if catalog_shapes is None:
        catalog = None
    else:
        catalog = {(int(e), int(d), round_inter(i), int(k)) for e, d, i, k in catalog_shapes}
    named = configs.items() if isinstance(configs, Mapping) else ((None, c) for c in configs)
    layouts = [(tp, 1) for tp in tps] + [(ep, ep) for ep in eps if ep > 1]
    served = []
    for name, config in named:
        for tp, ep in layouts:
            found = {}
            for fuse in (False, True):
                try:
                    d = shapes_from_config(config, tp, ep, fuse, name=name)
                except ModelConfigError:
                    continue
                if d.shape in catalog if catalog is not None else accept(d.shape):
                    found.setdefault((d.shape, d.fused_shared), d)
            served += [Served(d.model, tp, ep, d.fused_shared, d.shape) for d in found.values()]
    return served
