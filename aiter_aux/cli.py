"""``aiter-aux``: build, list and exercise module_moe_mxfp4_aux.

aiter-aux build [--backend B] [--verbose] [--rebuild]
aiter-aux list
aiter-aux run --shape E,MODEL_DIM,INTER,TOPK --tokens 1,16,512,4096 [--block-m 32]
aiter-aux clean
aiter-aux doctor [--backend B] [--no-dry-run]
aiter-aux add-shape E,MODEL_DIM,INTER,TOPK [--note TEXT] [--no-build]
aiter-aux remove-shape E,MODEL_DIM,INTER,TOPK [--no-build]
"""

from __future__ import annotations

import argparse
import sys
import time

from . import env


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        parts = tuple(int(p) for p in text.replace(" ", "").split(","))
    except ValueError:
        parts = ()
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected E,MODEL_DIM,INTER,TOPK (4 ints), got {text!r}")
    return parts


def _int_list(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _progress(done: int, total: int, what: str) -> None:
    """Build progress on stderr: one updating line on a TTY, else plain lines every ~10% or
    few seconds (:class:`aiter_aux.jit.progress.Reporter`)."""
    from .jit.progress import default_reporter

    default_reporter()(done, total, what)


def cmd_build(args) -> int:
    from .jit.build import build_module
    from .jit.paths import codegen_module

    shapes = codegen_module("gen_instances").SHAPES
    print(f"aiter-aux build: {len(shapes)} shapes")
    r = build_module(backend=args.backend, verbose=args.verbose, force=args.rebuild,
                     progress=_progress)  # fmt: skip
    from .jit.progress import default_reporter

    default_reporter().finish(r)  # when something compiled: the time and the slowest TUs
    cached = r.num_instances - min(r.compiled, r.num_instances)
    print(f"  toolchain : {r.toolchain}")
    print(f"  instances : {r.num_instances} ({r.compiled} instance TUs compiled, "
          f"{cached} cached){', relinked' if r.linked else ''}")  # fmt: skip
    print(f"  wall time : {r.wall_s:.2f} s")
    print(f"  module    : {r.module_path}")
    return 0


def cmd_list(args) -> int:
    from .jit.paths import codegen_module

    inst = codegen_module("instances")
    shapes = codegen_module("gen_instances").SHAPES
    print(f"{'expert':>6} {'model_dim':>9} {'inter':>6} {'topk':>4}  instances")
    for s in shapes:
        keys = [i.key for i in inst.instances_for_shape(s)]
        print(f"{s[0]:>6} {s[1]:>9} {s[2]:>6} {s[3]:>4}  {' '.join(keys)}")
    n = len(inst.enumerate_instances(shapes))
    print(f"{len(shapes)} shapes, {n} unique instances")
    return 0


def cmd_run(args) -> int:
    from .pipeline import run_pipeline

    return run_pipeline(args.shape, args.tokens, args.block_m, args.seed, args.device)


def cmd_clean(args) -> int:
    import shutil

    from .jit.paths import cache_root

    root = cache_root()
    if root.is_dir():
        shutil.rmtree(root)
        print(f"removed {root}")
    else:
        print(f"nothing to remove at {root}")
    return 0


def cmd_edit_shape(args) -> int:
    """add-shape / remove-shape: edit both catalog lists, then rebuild the new catalog."""
    from .catalog_edit import CatalogEditError, add_shape, remove_shape

    try:
        if args.command == "add-shape":
            r = add_shape(args.shape, args.note)
        else:
            r = remove_shape(args.shape)
    except CatalogEditError as e:
        print(f"aiter-aux {args.command}: error: {e}", file=sys.stderr)
        return 2
    print(r.summary())
    if args.no_build:
        print("  not rebuilt (--no-build); run `aiter-aux build`")
        return 0
    from .jit.build import build_module

    # This process imported the old catalog; build the edited one explicitly.
    b = build_module(r.shapes, backend=args.backend, progress=_progress)
    from .jit.progress import default_reporter

    default_reporter().finish(b)
    relinked = ", relinked" if b.linked else ""
    print(f"  rebuilt   : {b.num_shapes} shapes, {b.num_instances} instances, "
          f"{b.compiled} instance TUs compiled{relinked}, {b.wall_s:.2f} s")  # fmt: skip
    print(f"  module    : {b.module_path}")
    return 0


def cmd_doctor(args) -> int:
    from .doctor import doctor

    return doctor(args.backend, run_ninja=not args.no_dry_run)


def main(argv: list[str] | None = None) -> int:
    from .jit.paths import codegen_module

    backends = codegen_module("instances").BACKENDS  # the one list (stdlib-only module)
    parser = argparse.ArgumentParser(prog="aiter-aux", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="generate and compile the module for the whole catalog")
    p.add_argument(
        "--backend",
        choices=backends,
        default=None,
        help="default: $AITER_AUX_BACKEND, else the visible GPU's, else cpu",
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=None,
        help="show the compiler commands (also AITER_AUX_VERBOSE=1)",
    )
    p.add_argument("--rebuild", action="store_true", default=None,
                   help="recompile everything (also AITER_AUX_REBUILD=1)")  # fmt: skip
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("list", help="print the shape catalog and its instance keys")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("run", help="run and check the aux pipeline of one shape")
    p.add_argument("--shape", type=_shape, required=True, help="E,MODEL_DIM,INTER,TOPK")
    p.add_argument("--tokens", type=_int_list, default=[1, 16, 512, 4096],
                   help="comma-separated token counts (default: 1,16,512,4096)")  # fmt: skip
    p.add_argument("--block-m", type=int, default=32, choices=(16, 32, 64, 128))
    p.add_argument("--seed", type=int, default=None, help="default: fresh randomness")
    p.add_argument("--device", default="cpu", help="torch device of the tensors (cpu, cuda)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("clean", help="remove the build cache ($AITER_AUX_CACHE_DIR)")
    p.set_defaults(func=cmd_clean)
    p = sub.add_parser("doctor", help="backend, compilers, cache state, what would be rebuilt")
    p.add_argument("--backend", choices=backends, default=None)
    p.add_argument("--no-dry-run", action="store_true", help="skip `ninja -n` on a temp copy")
    p.set_defaults(func=cmd_doctor)
    for name, what in (
        ("add-shape", "add a model shape to"),
        ("remove-shape", "remove a shape from"),
    ):
        p = sub.add_parser(name, help=f"{what} both catalog lists, then rebuild")
        p.add_argument(
            "shape", type=_shape, help="E,MODEL_DIM,INTER,TOPK (INTER rounded up to 256)"
        )
        if name == "add-shape":
            p.add_argument("--note", default=None, help="the comment of the new line (model name)")
        p.add_argument("--no-build", action="store_true", help="edit only, do not rebuild")
        p.add_argument("--backend", choices=backends, default=None)
        p.set_defaults(func=cmd_edit_shape)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    finally:
        if env.get("AITER_AUX_TIMING"):
            print(f"[{time.perf_counter() - t0:.2f} s]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
