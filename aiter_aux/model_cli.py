"""The catalog seen from the models' side, for the command line.

* ``aiter-aux add-shape --from-config CONFIG.json --tp N [--ep N]``: the shape of the model's
  MoE layer, derived by :mod:`aiter_aux.model_config` and printed step by step (padding of a
  model_dim that is not a multiple of 256 included), then added to both catalog lists as
  ``add-shape E,D,INTER,TOPK --note ...`` adds it; the note defaults to the derivation's
  comment (model, layout and the arithmetic).  A shape both lists already hold is said and
  is no error; ``--dry-run`` prints the derivation and the catalog line and edits nothing.
* ``aiter-aux list --models``: which layouts of the shipped model configs
  (:data:`aiter_aux.model_config.CONFIG_DIR`) the catalog serves, and which catalog shapes
  serve none of them.
"""

from __future__ import annotations

import argparse
import sys

WIDTH = 100  # the project's line length (pyproject.toml), also list --models' width


def row_width(wide: bool) -> int | None:
    """The width ``list`` and ``list --models`` cut a row to ("..."): :data:`WIDTH` on a
    terminal; None (rows whole) with ``--wide`` or when stdout is not a terminal (a pipe or
    a file, where nothing has to fit)."""
    return None if wide or not sys.stdout.isatty() else WIDTH


def clip(line: str, width: int | None) -> str:
    """``line`` cut to ``width`` columns (None: whole), its end replaced by "..."."""
    return line if width is None or len(line) <= width else line[: width - 3] + "..."


def add_from_config_options(p: argparse.ArgumentParser) -> None:
    """add-shape's --from-config and the options that go with it."""
    g = p.add_argument_group("from a model's config.json (instead of E,D,INTER,TOPK)")
    g.add_argument("--from-config", metavar="CONFIG.json",
                   help="derive the shape from a Hugging Face config.json (DeepSeek-V3/V4, "
                   "Qwen3-MoE, gpt-oss, Kimi-K2, GLM-4.5, Llama-4, Mixtral key names), print "
                   "each step; the note defaults to the model, layout and arithmetic")  # fmt: skip
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size (required)")
    g.add_argument("--ep", type=int, metavar="N",
                   help="expert-parallel size (default 1): EP >= TP splits the experts only, "
                   "EP < TP splits inter over TP / EP")  # fmt: skip
    g.add_argument("--fuse-shared", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse one shared expert of the routed size as one more expert (E + 1, "
                   "topk + 1); default: fused without EP, not fused with EP")  # fmt: skip
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print the derivation and the catalog line; edit and build nothing",
    )


def _check_options(args) -> None:
    """Option combinations argparse cannot express, refused as argparse refuses (exit 2)."""
    config_only = [
        flag
        for flag, value in (
            ("--tp", args.tp),
            ("--ep", args.ep),
            ("--fuse-shared/--no-fuse-shared", args.fuse_shared),
            ("--dry-run", args.dry_run or None),
        )
        if value is not None
    ]
    if args.from_config is None:
        if args.shape is None:
            args.usage_error("give the shape E,MODEL_DIM,INTER,TOPK or --from-config CONFIG.json")
        if config_only:
            args.usage_error(f"{', '.join(config_only)}: only with --from-config")
        if args.note is None:
            args.usage_error("the following arguments are required: --note/--model")
    elif args.shape is not None:
        args.usage_error("give the shape E,MODEL_DIM,INTER,TOPK or --from-config, not both")
    elif args.tp is None:
        args.usage_error("--from-config needs --tp N (the tensor-parallel size)")


def _catalog_view(shape) -> tuple[dict, int]:
    """({file: entry} of the catalog lists that hold ``shape``, the columns its new line
    takes before the comment in the more indented list)."""
    from .catalog_edit import CATALOG_LIST, OPS_LIST, default_files, read_entries

    found, prefix = {}, 0
    for path, name in zip(default_files(), (CATALOG_LIST, OPS_LIST), strict=True):
        lines = path.read_text(encoding="utf-8").splitlines()
        indent = 0
        for entry in read_entries(path, name):
            text = lines[entry.line - 1]
            indent = max(indent, len(text) - len(text.lstrip()))
            if entry.shape == shape:
                found[path] = entry
        prefix = max(prefix, indent + len(f"{shape},  # "))
    return found, prefix


def plan_add_shape(args) -> bool:
    """Check add-shape's options; with ``--from-config`` print the derivation and set
    ``args.shape`` and ``args.note`` to the derived shape and its comment.  True when the
    shape is to be added (and rebuilt) as ``add-shape E,D,INTER,TOPK`` adds it; False after
    ``--dry-run`` or when both catalog lists already hold the shape (said on stdout)."""
    _check_options(args)
    if args.from_config is None:
        return True
    from .catalog_edit import CatalogEditError, check_shape, default_files
    from .model_config import ModelConfigError, format_derivation, load_config, shapes_from_config

    ep = 1 if args.ep is None else args.ep
    config = load_config(args.from_config)  # its errors name the file
    try:
        d = shapes_from_config(config, args.tp, ep, args.fuse_shared)
    except ModelConfigError as e:  # the derivation's: say which file it was
        raise ModelConfigError(f"{args.from_config}: {e}") from None
    errors = check_shape(d.shape, default_files()[0])
    if errors:  # model_config applies the same rules; this is the catalog's own word
        raise CatalogEditError(f"cannot add {d.shape}: " + "; ".join(errors))
    present, prefix = _catalog_view(d.shape)
    # the longest derived comment whose line fits the project's line length
    fits = [c for c in d.comments() if prefix + len(c) <= WIDTH] or [d.comments()[-1]]
    note = " ".join((args.note or "").split()) or fits[0]
    lines = format_derivation(d)
    lines[-1] = f"catalog line: {d.shape},  # {note}"
    if ep > 1:  # what the engines' drop-in sorts ask for under EP, besides this shape
        e_local = d.routed_experts // ep
        lines.insert(-1, (
            f"drop-ins under EP {ep}: vLLM's moe_align_block_size takes the global "
            f"num_experts ({d.routed_experts}) with an expert_map (instance "
            f"moe_align_block_size_vllm_e{d.routed_experts}), SGLang's the local experts + 1 "
            f"({e_local + 1}: moe_align_block_size_sglang_e{e_local}); neither needs a catalog "
            "line: each is built on its first call (or prebuilt by `aiter-aux build` when a "
            "catalog shape has that E)"))  # fmt: skip
    print("\n".join(lines))
    args.shape, args.note = d.shape, note
    if len(present) == 2:
        where = ", ".join(f"{p}:{e.line}" for p, e in present.items())
        comment = next(iter(present.values())).comment
        print(f"{d.shape} is already in the catalog, as {comment!r} ({where}): nothing to add")
        print(f"  run it    : aiter-aux run --shape {','.join(map(str, d.shape))}")
        return False
    if args.dry_run:
        if present:
            print(f"dry run: {d.shape} is in {next(iter(present))} only; add-shape would add "
                  "it to the other list")  # fmt: skip
        else:
            print(f"dry run: {d.shape} is not in the catalog; add-shape would add the line to "
                  "both lists and rebuild")  # fmt: skip
        return False
    sys.stdout.flush()
    return True


def _layouts(config, served) -> str:
    """The layouts of one model that the catalog serves, grouped by shared-expert fusion
    where the model has a fusable shared expert."""
    from .model_config import ModelConfigError, layout_name, shapes_from_config

    try:
        d = shapes_from_config(config, 1)
    except ModelConfigError as e:
        return f"cannot derive: {e}"
    if d.fusable_shared:
        parts = []
        for fused in (True, False):
            names = [layout_name(s.tp, s.ep) for s in served if s.fused_shared is fused]
            if names:
                parts.append(f"{'fused' if fused else 'not fused'}: {' '.join(names)}")
        text = "; ".join(parts) or "none"
    else:
        text = " ".join(layout_name(s.tp, s.ep) for s in served) or "none"
    if d.shape[1] != d.hidden:
        text += f" (hidden {d.hidden} padded to {d.shape[1]})"
    return text


def list_models(args) -> int:
    """``aiter-aux list --models``."""
    from .catalog_edit import default_files, read_entries
    from .jit.paths import codegen_module
    from .model_config import DEFAULT_EPS, DEFAULT_TPS, models_served, shipped_configs

    width = row_width(args.wide)
    catalog = codegen_module("catalog")
    shapes = [tuple(s) for s in catalog.SHAPES]
    configs = shipped_configs()
    served = models_served(shapes, configs)
    prebuilt = {(s.model, s.tp, s.ep, s.fused_shared) for s in served}
    servable = models_served(None, configs, accept=lambda s: not catalog.validate_shape(s))
    name_width = max(map(len, configs), default=5)
    print(f"{'model':<{name_width}}  layouts: prebuilt (the catalog's) | built on first use")
    for name, config in configs.items():
        mine = [s for s in served if s.model == name]
        rest = [s for s in servable if s.model == name
                and (s.model, s.tp, s.ep, s.fused_shared) not in prebuilt]  # fmt: skip
        text = f"{_layouts(config, mine)} | {_layouts(config, rest)}"
        print(clip(f"{name:<{name_width}}  {text}", width))
    tps = " ".join(map(str, DEFAULT_TPS))
    eps = " ".join(map(str, DEFAULT_EPS))
    print(f"{len(configs)} shipped model configs; layouts tried: TP {tps} (TP splits inter), "
          f"EP {eps} (over as many ranks)")  # fmt: skip
    print("other models: aiter-aux add-shape --from-config CONFIG.json --tp N [--dry-run]")

    try:
        comments = {e.shape: e.comment for e in read_entries(default_files()[0])}
    except (OSError, ValueError) as e:
        print(f"aiter-aux list: no model names: {e}", file=sys.stderr)
        comments = {}
    used = {s.shape for s in served}
    unused = [s for s in shapes if s not in used]
    print()
    print(f"catalog shapes serving none of these models: {len(unused)} of {len(shapes)}")
    if unused:
        print(f"{'expert':>6} {'model_dim':>9} {'inter':>6} {'topk':>4}  model")
    for s in unused:
        print(clip(f"{s[0]:>6} {s[1]:>9} {s[2]:>6} {s[3]:>4}  {comments.get(s, '')}", width))
    return 0
