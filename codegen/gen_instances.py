"""Generate the instance translation units and the lookup of module_moe_mxfp4_aux.

The shapes come from the catalog, ``SHAPES`` of ``codegen/catalog.py`` (default), or from
the caller.

CLI::

    python codegen/gen_instances.py --working_path DIR [--backend cpu|cuda|rocm]
    python codegen/gen_instances.py --list

This module imports neither torch nor aiter_aux.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a script: load our package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "codegen"  # noqa: A001

from .catalog import SHAPES, validate_catalog  # noqa: E402
from .instances import BACKENDS, enumerate_instances  # noqa: E402
from .render import Renderer  # noqa: E402
from .writer import GenerateResult, write_if_different, write_sources  # noqa: E402


def generate(
    working_path: str | Path,
    backend: str = "cpu",
    shapes: list[tuple[int, int, int, int]] | None = None,
) -> GenerateResult:
    """Render every instance TU of ``shapes`` (default ``SHAPES``), the lookup, the kernels
    TUs (CPU) and the torch binding (the last two depend on the op table only) into
    ``working_path``; files are written only when their bytes change and instance files of
    keys no longer listed are removed.  Raises ``ValueError`` for an invalid catalog."""
    shapes = SHAPES if shapes is None else shapes
    errors = validate_catalog(shapes)
    if errors:
        raise ValueError("invalid shape catalog:\n  " + "\n  ".join(errors))
    instances = enumerate_instances(shapes)
    renderer = Renderer(backend)
    files = {renderer.instance_filename(i): renderer.render_instance(i) for i in instances}
    lookup = {renderer.lookup_filename(): renderer.render_lookup(instances)}
    kernels = renderer.render_kernels()
    result = write_sources(Path(working_path), files, {**lookup, **kernels},
                           renderer.instance_glob())  # fmt: skip
    result.lookup_file = Path(working_path) / renderer.lookup_filename()
    result.kernel_files = [Path(working_path) / name for name in kernels]
    result.binding_file = Path(working_path) / renderer.binding_filename()
    written = write_if_different(result.binding_file, renderer.render_binding())
    (result.written if written else result.unchanged).append(result.binding_file)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--working_path", type=Path, help="directory for the generated sources")
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--list", action="store_true", help="print the instance keys and exit")
    args = parser.parse_args(argv)
    if args.list:
        try:
            for inst in enumerate_instances(SHAPES):
                print(inst.key)
            sys.stdout.flush()
        except BrokenPipeError:  # e.g. `--list | head`: the reader is gone, not an error
            sys.stdout = None
        return 0
    if args.working_path is None:
        parser.error("--working_path is required unless --list is given")
    result = generate(args.working_path, args.backend)
    print(
        f"{len(SHAPES)} shapes -> {result.num_instances} instances in {args.working_path}: "
        f"{len(result.written)} written, {len(result.unchanged)} unchanged, "
        f"{len(result.removed)} removed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
