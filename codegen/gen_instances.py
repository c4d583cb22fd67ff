"""Generate the instance translation units and the lookup of module_moe_mxfp4_aux.

``SHAPES`` is the codegen copy of the supported-shape catalog; it must equal
``MXFP4_MOE_SUPPORTED_SHAPES`` in ``aiter_aux/ops/moe_mxfp4_aux.py`` (the AST test in
``op_tests/test_mxfp4_moe_aux_codegen.py`` checks it).  Each tuple is
``(expert, model_dim, inter_rounded, topk)``; ``expert`` counts a fused shared expert
where it is odd, and ``topk`` then counts it too.  Add a shape with
``aiter-aux add-shape E,MODEL_DIM,INTER,TOPK`` or by hand in both lists.

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

from .instances import BACKENDS, enumerate_instances, validate_catalog  # noqa: E402
from .render import Renderer  # noqa: E402
from .writer import GenerateResult, write_if_different, write_sources  # noqa: E402

# (expert, model_dim, inter_rounded, topk)
SHAPES = [
    (385, 7168, 512, 9),  # Kimi-K2.5 TP4
    (385, 7168, 1024, 9),  # Kimi-K2.5 TP2
    (385, 7168, 256, 9),  # Kimi-K2.5 TP8
    (384, 7168, 512, 8),  # Kimi-K2 TP4
    (384, 7168, 256, 8),  # Kimi-K2 TP8 (moe_inter 2048 / 8)
    (257, 7168, 512, 9),  # DeepSeek-R1 TP4
    (257, 7168, 256, 9),  # DeepSeek-R1 TP8
    (256, 7168, 512, 8),  # DeepSeek-V3/R1 TP4, shared expert not fused (moe_inter 2048 / 4)
    (256, 7168, 256, 8),  # DeepSeek-V3/R1 TP8, shared expert not fused (moe_inter 2048 / 8)
    (32, 7168, 2048, 8),  # DeepSeek-V3/R1 EP8 (256 / 8 local experts)
    (33, 7168, 2048, 8),  # no public model (DeepSeek-V3/R1 EP8 plus one expert, topk 8)
    (64, 7168, 2048, 8),  # DeepSeek-V3/R1 EP4 (256 / 4 local experts)
    (256, 3072, 1536, 8),  # MiniMax TP2
    (256, 3072, 768, 8),  # MiniMax TP4
    (256, 3072, 512, 8),  # MiniMax-M3 (inter 384 -> 512)
    (256, 3072, 256, 8),  # MiniMax-M2 TP8 (moe_inter 1536 / 8 = 192 -> 256)
    (512, 4096, 256, 10),  # Qwen3.5-397B
    (512, 4096, 512, 10),  # Qwen3.5-397B-A17B TP2, shared expert not fused (moe_inter 1024 / 2)
    (513, 4096, 512, 11),  # Qwen3.5-397B-A17B TP2, shared expert fused (moe_inter 1024 / 2)
    (48, 7168, 3072, 6),  # DeepSeek-V4 EP8
    (24, 7168, 3072, 6),  # DeepSeek-V4 EP16 (384 / 16 local experts)
    (384, 7168, 1536, 6),  # DeepSeek-V4 TP2
    (384, 7168, 768, 6),  # DeepSeek-V4 TP4
    (384, 7168, 512, 6),  # DeepSeek-V4 TP6/TP8
    (385, 7168, 1536, 7),  # DeepSeek-V4 TP2, shared expert fused (moe_inter 3072 / 2)
    (385, 7168, 768, 7),  # DeepSeek-V4 TP4, shared expert fused (moe_inter 3072 / 4)
    (385, 7168, 512, 7),  # DeepSeek-V4 TP6/TP8, shared expert fused (moe_inter 3072 / 6 or / 8)
    (256, 4096, 256, 6),  # DeepSeek-V4-Lite
    (256, 4096, 2048, 6),  # DeepSeek-V4-Flash TP1, shared expert not fused (moe_inter 2048)
    (289, 4096, 2048, 9),  # GLM-5.3-Flash (no AITER aux instance: aiter#5156)
    (384, 5120, 768, 6),  # no public model
    (384, 5120, 1280, 6),  # no public model
    (128, 5120, 768, 3),  # no public model
    (128, 5120, 1280, 3),  # no public model
    (96, 5120, 2304, 6),  # DeepSeek-V4.1-Flash TP4+EP
    (32, 5120, 2304, 2),  # no public model
    (32, 5120, 2304, 3),  # no public model
    (257, 6144, 2048, 9),  # GLM-5.2 TP1 (moe_inter 2048, as the TP4/TP8 lines)
    (257, 6144, 1024, 9),  # GLM-5.2 TP2 (moe_inter 2048 / 2)
    (257, 6144, 512, 9),  # GLM-5.2 TP4
    (257, 6144, 256, 9),  # GLM-5.2 TP8
    (129, 6144, 512, 5),  # no public model
    (129, 6144, 768, 5),  # no public model
    (256, 6144, 512, 8),  # GLM-5.2 routed-only TP4
    (896, 3584, 512, 16),  # Kimi-K3
    (896, 3584, 3072, 16),  # no public model
    (56, 3584, 3072, 16),  # no public model
    (128, 3072, 512, 4),  # gpt-oss-120b TP8 (hidden 2880 padded to 3072; inter 360 -> 512)
    (128, 3072, 1536, 4),  # gpt-oss-120b TP2 (hidden 2880 padded to 3072; inter 1440 -> 1536)
    (128, 3072, 3072, 4),  # gpt-oss-120b TP1 (hidden 2880 padded to 3072; inter 2880 -> 3072)
    (513, 2560, 768, 11),  # Qwen3.8-Flash-Next TP1 (inter 640 -> 768)
    (513, 8192, 256, 11),  # Qwen3.8 TP8, shared expert fused
]


def generate(
    working_path: str | Path,
    backend: str = "cpu",
    shapes: list[tuple[int, int, int, int]] | None = None,
) -> GenerateResult:
    """Render every instance TU of ``shapes`` (default ``SHAPES``), the lookup and the torch
    binding (which depends on the op table only) into
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
    result = write_sources(Path(working_path), files, lookup, renderer.instance_glob())
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
