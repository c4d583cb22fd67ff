"""``aiter-aux``: build, list, run and edit the catalog of module_moe_mxfp4_aux."""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
import traceback

from . import __version__, env
from .limits import BLOCK_M_VALUES, MAX_NUM_TOKENS
from .shapes import ShapeError, parse_ints, parse_shape

DESCRIPTION = """\
The JIT build system of the MXFP4 MoE auxiliary kernels (sort, quant, sort_scales,
scatter_reduce): build the module for the shape catalog, run and time the pipeline of one
shape with every output checked, and add or remove catalog shapes."""
EPILOG = """\
examples:
  aiter-aux build                                  compile the whole catalog (CPU here)
  aiter-aux list                                   the catalog with model names
  aiter-aux run --shape 513,2560,640,11 --tokens 1,16,512,4096 --csv run.csv
  aiter-aux add-shape 160,5120,1536,8 --note "GLM-4.5 TP1"
  aiter-aux add-shape --from-config gpt-oss-120b/config.json --tp 4
  aiter-aux list --models                          which model layouts the catalog serves
  aiter-aux list --cached                          the instances built on demand
  aiter-aux remove-shape 160,5120,1536,8
  aiter-aux clean --backend cpu                    remove the CPU builds only
  aiter-aux doctor                                 toolchain, cache state, what would rebuild

Each subcommand has its own --help.  -v/--verbose (or AITER_AUX_VERBOSE=1) shows compiler
commands and full tracebacks; without it an error is one line and exit code 2."""
# An argument like "-1,3072,256,8" or "-5,1" is a value, not an option: argparse only
# takes plain negative numbers as values, so such arguments get a leading space (the
# parsers ignore spaces) before argparse sees them.
_NEGATIVE_LIST = re.compile(r"-\d[\d,;\s-]*")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (and exit 2), pointing at --help; -v before or after the
    subcommand (its action is shared with the subcommands, so it has no default of its own:
    a default would be reset by the subcommand's parse)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    top = False  # the program's parser (not a subcommand's)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        if self.top and not hasattr(ns, "verbose"):
            ns.verbose = False
        return ns, rest

    def parse_args(self, args=None, namespace=None):
        ns, rest = self.parse_known_args(args, namespace)
        if rest:  # argparse reports these on the program's parser: name the subcommand's
            sub = (self.subcommands or {}).get(getattr(ns, "command", None), self)
            sub.error(f"unrecognized arguments: {' '.join(rest)}")
        return ns

    subcommands: dict | None = None  # name -> its parser (the program's parser only)


class _Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; text with indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n  " in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _type(fn, *args, **kwargs):
    def convert(text: str):
        try:
            return fn(text, *args, **kwargs)
        except ShapeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = fn.__name__
    return convert


SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes a uint64


def _finite_float(text: str) -> float:
    """A float option: NaN and the infinities (``nan``, ``inf``, ``1e999``) are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def parse_int(text: str, *, lo: int, hi: int) -> int:
    """One integer in ``[lo, hi]``."""
    values = parse_ints(text, lo=lo, hi=hi)
    if len(values) != 1:
        raise ShapeError(f"expected one integer, got {text.strip()!r}")
    return values[0]


def _build(shapes=None, backend=None, verbose=None, force=None):
    """build_module with progress on stderr; the slowest TUs of this build afterwards."""
    from .jit.build import build_module
    from .jit.progress import default_reporter

    rep = default_reporter()
    rep.begin()
    r = build_module(shapes, backend=backend, verbose=verbose, force=force, progress=rep)
    rep.finish(r)
    return r


def cmd_build(args) -> int:
    from .jit.paths import codegen_module

    shapes = codegen_module("catalog").SHAPES
    print(f"aiter-aux build: {len(shapes)} shapes")
    r = _build(backend=args.backend, verbose=args.verbose or None, force=args.rebuild)
    cached = r.num_instances - min(r.compiled, r.num_instances)
    print(f"  toolchain : {r.toolchain}")
    print(f"  instances : {r.num_instances} ({r.compiled} instance TUs compiled, "
          f"{cached} cached){', relinked' if r.linked else ''}")  # fmt: skip
    print(f"  wall time : {r.wall_s:.2f} s")
    print(f"  module    : {r.module_path}")
    return 0


def cmd_list(args) -> int:
    if args.models:
        from .model_cli import list_models

        return list_models(args)
    if args.cached:
        from .jit.ondemand import cached
        from .jit.paths import cache_root

        root = cache_root()
        if root.exists() and not root.is_dir():
            raise NotADirectoryError(f"the build cache {root} is not a directory "
                                     "(AITER_AUX_CACHE_DIR)")  # fmt: skip
        found = cached()
        for build, key, path, intact in found:
            state = "" if intact else ", differs from its manifest: its next call rebuilds it"
            print(f"{build}  {key}  ({path.stat().st_size // 1024} KiB{state})")
        print(f"{len(found)} instance(s) built on demand in {cache_root()} (aiter-aux clean "
              "--on-demand removes them)")  # fmt: skip
        return 0
    from .catalog_edit import default_files, read_entries
    from .jit.paths import codegen_module
    from .model_cli import clip, row_width

    inst = codegen_module("instances")
    catalog = codegen_module("catalog")
    shapes = catalog.SHAPES
    errors = catalog.validate_catalog(shapes)
    if errors:
        raise ValueError(f"invalid catalog: {'; '.join(errors)}")
    try:
        models = {e.shape: e.comment for e in read_entries(default_files()[0])}
    except (OSError, ValueError) as e:
        print(f"aiter-aux list: no model names: {e}", file=sys.stderr)
        models = {}
    width = row_width(args.wide)
    print(f"{'expert':>6} {'model_dim':>9} {'inter':>6} {'topk':>4}  model")
    for s in shapes:
        print(clip(f"{s[0]:>6} {s[1]:>9} {s[2]:>6} {s[3]:>4}  {models.get(tuple(s), '')}", width))
        if args.wide:
            print("        " + " ".join(i.key for i in inst.instances_for_shape(s)))
    n = len(inst.enumerate_instances(shapes))
    print(f"{len(shapes)} shapes, {n} unique instances" + ("" if args.wide else
          " (--wide: each shape's instance keys)"))  # fmt: skip
    return 0


def cmd_run(args) -> int:
    from .pipeline import Options, run_pipeline

    options = Options(args.ep_ranks, args.shared_init, args.routed_scaling, args.quant, args.router)
    return run_pipeline(args.shape, args.tokens, args.block_m, args.seed, args.device,
                        repeat=args.repeat, csv_path=args.csv, json_path=args.json,
                        options=options)  # fmt: skip


def cmd_clean(args) -> int:
    import shutil

    from .jit.paths import cache_root

    root = cache_root()
    if not root.is_dir():
        print(f"nothing to remove at {root}")
        return 0
    if args.on_demand:
        from .jit.paths import KEYS_DIR

        pattern = f"{args.backend or '*'}-*/{KEYS_DIR}"
        targets = sorted(p for p in root.glob(pattern) if p.is_dir())
        if not targets:
            print(f"no instance built on demand in {root}")
            return 0
    elif args.backend:
        targets = sorted(p for p in root.glob(f"{args.backend}-*") if p.is_dir())
        if not targets:
            print(f"no {args.backend} build in {root}")
            return 0
    else:
        targets = [root]
        if not args.yes:
            builds = sum(1 for p in root.iterdir() if p.is_dir())
            question = (
                f"remove {root} and its {builds} build director{'y' if builds == 1 else 'ies'}"
            )
            if not sys.stdin.isatty():
                print(
                    f"aiter-aux clean: error: would {question}; pass --yes to confirm "
                    "(or --backend B to remove one backend's builds)",
                    file=sys.stderr,
                )
                return 2
            if input(f"{question}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing removed")
                return 1
    from .jit.lock import CacheLock

    # no build runs while the directories go: builders hold the cache lock shared
    with CacheLock(root, exclusive=True, what="the builds in progress to finish"):
        for path in targets:
            try:
                shutil.rmtree(path)
            except OSError as e:  # rmtree names the entry it stopped at, relative to its dir
                raise OSError(e.errno, f"cannot remove {path}: {e.strerror}") from None
            print(f"removed {path}")
    return 0


def cmd_edit_shape(args) -> int:
    """add-shape / remove-shape: edit both catalog lists, then rebuild the new catalog."""
    from .catalog_edit import add_shape, remove_shape

    failed = []

    def rebuild(r) -> None:  # runs under the catalog lock: the catalog built is the one on disk
        print(r.summary(), flush=True)
        # This process imported the old catalog; build the edited one explicitly.
        try:
            b = _build(r.shapes, backend=args.backend, verbose=args.verbose or None)
        except Exception:
            failed.append(r.shape)
            raise
        relinked = ", relinked" if b.linked else ""
        print(f"  rebuilt   : {b.num_shapes} shapes, {b.num_instances} instances, "
              f"{b.compiled} instance TUs compiled{relinked}, {b.wall_s:.2f} s")  # fmt: skip
        print(f"  module    : {b.module_path}")

    then = None if args.no_build else rebuild
    try:
        if args.command == "add-shape":  # --from-config: added meanwhile is no error
            exist_ok = getattr(args, "from_config", None) is not None
            r = add_shape(args.shape, args.note, then=then, exist_ok=exist_ok)
        else:
            r = remove_shape(args.shape, then=then)
    except Exception:
        if failed:  # the edit's rebuild failed: say what the catalog holds now
            state = ("was taken out of the catalog again (both lists as before)"
                     if args.command == "add-shape" else
                     "stays removed; `aiter-aux build` once the cause is fixed")  # fmt: skip
            print(f"aiter-aux {args.command}: the build failed: {failed[0]} {state}",
                  file=sys.stderr)  # fmt: skip
        raise
    if r.action == "present":
        print(f"{r.shape} is already in the catalog (added meanwhile by another add-shape): "
              "nothing to add")  # fmt: skip
    elif args.no_build:
        print(r.summary())
        print("  not rebuilt (--no-build); run `aiter-aux build`")
    return 0


def cmd_add_shape(args) -> int:
    """add-shape: E,D,INTER,TOPK with --note, or --from-config (model_cli), then as
    cmd_edit_shape."""
    from .model_cli import plan_add_shape

    if not plan_add_shape(args):
        return 0
    code = cmd_edit_shape(args)
    if args.from_config is not None and not args.no_build:
        print(f"  run it    : aiter-aux run --shape {','.join(map(str, args.shape))}")
    return code


def cmd_doctor(args) -> int:
    from .doctor import doctor

    return doctor(args.backend, run_ninja=not args.no_dry_run)


def build_parser() -> argparse.ArgumentParser:
    from .jit.paths import codegen_module
    from .model_cli import add_from_config_options

    try:
        backends = codegen_module("instances").BACKENDS  # the one backend list
    except (OSError, ValueError, ImportError):  # no sources: --version and --help still work,
        backends = None  # and a command that needs them says so in one line
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show compiler commands and full tracebacks "
                        "(also AITER_AUX_VERBOSE=1)")  # fmt: skip
    backend = argparse.ArgumentParser(add_help=False)
    backend.add_argument("--backend", choices=backends, default=None,
                         help="default: $AITER_AUX_BACKEND, else the visible GPU's, "
                         "else cpu")  # fmt: skip
    parser = _Parser(prog="aiter-aux", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=_Formatter, parents=[common])  # fmt: skip
    parser.top = True
    parser.add_argument("--version", action="version", version=f"aiter-aux {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.subcommands = sub.choices

    def add(name, help, description, *parents, epilog=None):
        p = sub.add_parser(name, help=help, description=description, epilog=epilog,
                           parents=[common, *parents], formatter_class=_Formatter)  # fmt: skip
        return p

    p = add("build", "generate and compile the module for the whole catalog",
            "Generate the instance sources of every catalog shape and compile what changed "
            "into the build cache ($AITER_AUX_CACHE_DIR); prints counts, wall time and the "
            "module path.", backend)  # fmt: skip
    p.add_argument("--rebuild", action="store_true", default=None,
                   help="recompile everything (also AITER_AUX_REBUILD=1)")  # fmt: skip
    p.set_defaults(func=cmd_build)

    p = add("list", "print the catalog: shapes and model names",
            "Print every catalog shape (expert, model_dim, inter rounded up to 256, topk) "
            "with the model named by its catalog comment; on a terminal a row is cut to 100 "
            "columns (whole with --wide or when stdout is not a terminal).")  # fmt: skip
    p.add_argument(
        "--wide",
        action="store_true",
        help="rows whole, not cut to 100 columns; list: also each shape's instance keys",
    )
    view = p.add_mutually_exclusive_group()
    view.add_argument("--models", action="store_true",
                      help="which (model, TP/EP) layouts of the shipped model configs the "
                      "catalog serves, and the shapes that serve none of them")  # fmt: skip
    view.add_argument("--cached", action="store_true",
                      help="the instances built on demand (outside the catalog's module) in "
                      "the build cache")  # fmt: skip
    p.set_defaults(func=cmd_list)

    p = add("run", "run, check and time the aux pipeline of one shape",
            "Draw random router logits, route them with the model's router (moe_route), run "
            "sort -> quant -> fused sort+quant -> the preamble in one call "
            "(moe_route_sort_quant, where the router routes every expert of the shape) -> "
            "sort_scales -> scatter_reduce(_q) at each token count, compare every output byte "
            "for byte "
            "with the torch reference and time each op (median, spread, bytes, GB/s).  Exit "
            "code 1 on any mismatch.",
            epilog="example:\n  aiter-aux run --shape 385,7168,512,9 --tokens 1,4096 "
            "--repeat 50 --json run.json")  # fmt: skip
    p.add_argument("--shape", type=_type(parse_shape), required=True, metavar="E,D,INTER,TOPK",
                   help="a MoE layer shape (the catalog's are prebuilt, others are built on "
                   "first use); INTER is rounded up to 256 (640 -> 768)")  # fmt: skip
    p.add_argument("--tokens", default=[1, 16, 512, 4096], metavar="M,M,...",
                   type=_type(parse_ints, lo=0, hi=MAX_NUM_TOKENS - 1),
                   help=f"comma-separated token counts in [0, {MAX_NUM_TOKENS}) "
                   "(default: 1,16,512,4096)")  # fmt: skip
    p.add_argument("--block-m", type=int, default=32, choices=BLOCK_M_VALUES,
                   help="rows per expert block of the sorted layout (default: 32)")  # fmt: skip
    p.add_argument("--seed", type=_type(parse_int, lo=0, hi=SEED_MAX), default=None,
                   help="seed of the routing and data (default: fresh, printed)")  # fmt: skip
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda[:N] (a ROCm GPU is cuda in torch)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="timed calls per op (default: what fits in 0.2 s, 5 to 100)")  # fmt: skip
    p.add_argument("--csv", metavar="FILE", help="also write one row per (tokens, op) to FILE")
    p.add_argument("--json", metavar="FILE", help="also write the run and its rows to FILE")
    p.add_argument(
        "--ep-ranks",
        type=int,
        default=1,
        metavar="N",
        help="also simulate expert parallelism over N ranks (expert_map): every "
        "rank's sort is checked and every pair must land on one rank",
    )
    p.add_argument(
        "--shared-init",
        action="store_true",
        help="also run the fused op with zero_buf_init (GEMM2 accumulator "
        "initialised from a shared expert's output)",
    )
    p.add_argument("--routed-scaling", type=_finite_float, default=1.0, metavar="F",
                   help="also run both reduces with routed_scaling_factor=F")  # fmt: skip
    p.add_argument("--quant", choices=("mxfp4", "mxfp8"), default="mxfp4",
                   help="activation format of the quant and fused ops: mxfp4 (a4w4, default) "
                   "or mxfp8 (a8w4: E4M3 elements, the same e8m0 scales)")  # fmt: skip
    p.add_argument("--router", default="auto", metavar="MODEL",
                   help="the router of the random logits: a shipped model (aiter-aux list "
                   "--models), a config.json, 'default' (softmax, renormalize) or 'auto' "
                   "(default: the model the shape serves, else 'default')")  # fmt: skip
    p.set_defaults(func=cmd_run)

    p = add("clean", "remove builds from the build cache",
            "Remove the build cache ($AITER_AUX_CACHE_DIR, default ~/.cache/aiter_aux): with "
            "--backend only that backend's build directories, else everything (asks first; "
            "--yes to skip the question, required when stdin is not a terminal).")  # fmt: skip
    p.add_argument("--backend", choices=backends, default=None,
                   help="remove only the <backend>-* build directories")  # fmt: skip
    p.add_argument(
        "--on-demand",
        action="store_true",
        help="remove only the instances built on demand (aiter-aux list --cached)",
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before removing all")
    p.set_defaults(func=cmd_clean)

    p = add("doctor", "check the toolchain and the cache; what a build would redo",
            "Print the backend, compiler, arch, cache directory and each build directory's "
            "state, the install's prebuilt modules and what `aiter-aux build` would rebuild.  "
            "Writes nothing; exit code 1 on a problem.", backend)  # fmt: skip
    p.add_argument("--no-dry-run", action="store_true",
                   help="skip the `ninja -n` dry run on a temporary copy (faster)")  # fmt: skip
    p.set_defaults(func=cmd_doctor)

    for name, what in (
        ("add-shape", "add a model shape to"),
        ("remove-shape", "remove a shape from"),
    ):
        p = add(name, f"{what} both catalog lists, then rebuild",
                f"{what[0].upper()}{what[1:]} SHAPES in codegen/catalog.py and "
                "MXFP4_MOE_SUPPORTED_SHAPES in aiter_aux/ops/moe_mxfp4_aux.py (one line each, "
                "under a lock), then build the new catalog (" + (
                    "only new instances compile)." if name == "add-shape"
                    else "nothing compiles: the lookup and the link)."),
                backend)  # fmt: skip
        p.add_argument("shape", type=_type(parse_shape), metavar="E,D,INTER,TOPK",
                       nargs="?" if name == "add-shape" else None,
                       help="expert (a fused shared expert counts), model_dim, inter (rounded "
                       "up to 256), topk")  # fmt: skip
        if name == "add-shape":
            p.add_argument("--note", "--model", dest="note", metavar="MODEL",
                           help="the model and split, written as the line's comment "
                           "(e.g. 'GLM-4.5 TP4'; 'no public model' if none); required with "
                           "E,D,INTER,TOPK")  # fmt: skip
            add_from_config_options(p)
        p.add_argument("--no-build", action="store_true", help="edit only, do not rebuild")
        p.set_defaults(func=cmd_edit_shape)
        if name == "add-shape":
            p.set_defaults(func=cmd_add_shape, usage_error=p.error)
    return parser


def _is_user_error(e: BaseException) -> bool:
    """Errors a user causes or can fix, shown as one line: bad values (ValueError,
    TypeError), the project's own errors (ToolchainError, CacheSafetyError, ...), OS errors."""
    return isinstance(e, ValueError | TypeError | OSError) or type(e).__module__.startswith(
        "aiter_aux"
    )


def _one_line(e: BaseException) -> str:
    """The message on one line, after the class name unless it is a plain ValueError."""
    text = "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
    if type(e) in (ValueError, TypeError) and text:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _env_flag(name: str) -> bool:
    """A flag variable; a bad value counts as unset here (the error reaches the user where
    the variable matters, not from the CLI's own bookkeeping)."""
    try:
        return bool(env.get(name))
    except env.EnvError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = [" " + a if _NEGATIVE_LIST.fullmatch(a) else a for a in argv]
    args = build_parser().parse_args(argv)
    verbose = args.verbose or _env_flag("AITER_AUX_VERBOSE")
    t0 = time.perf_counter()
    try:
        from .env import check_all

        check_all()  # a bad variable is refused before a command edits or builds anything
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `aiter-aux list | head`: the reader is gone, not an error
        sys.stdout = None
        return 0
    except Exception as e:
        build_error = getattr(sys.modules.get("aiter_aux.jit.build"), "BuildError", ())
        if not (_is_user_error(e) or isinstance(e, build_error)):
            raise
        if verbose:  # the traceback, then the same last line and exit code as without -v
            traceback.print_exc()
        if isinstance(e, build_error):  # the compiler's own output: keep its lines
            print(f"aiter-aux {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        hint = "" if verbose else " (-v for a traceback)"
        print(f"aiter-aux {args.command}: error: {_one_line(e)}{hint}", file=sys.stderr)
        return 2
    finally:
        if _env_flag("AITER_AUX_TIMING"):
            print(f"[{time.perf_counter() - t0:.2f} s]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
