"""Add or remove one model shape in both catalog lists, as minimal text edits.

The catalog lives in two Python list literals that must agree (the AST test
``op_tests/test_mxfp4_moe_aux_codegen.py`` checks it): ``SHAPES`` in
``codegen/gen_instances.py`` and ``MXFP4_MOE_SUPPORTED_SHAPES`` in
``aiter_aux/ops/moe_mxfp4_aux.py``, one ``(expert, model_dim, inter_rounded, topk)`` tuple
per line with a comment naming its source.  :func:`add_shape` appends one such line to each
list (after the last entry, same indentation), :func:`remove_shape` deletes the entry's
line; nothing else in either file changes, comments and formatting included.  The literals
are located with ``ast`` (their line numbers), and every edit is re-parsed and checked
before it is written.

Rules for a new shape: those of ``validate_shape`` in ``codegen/instances.py`` (loaded from
the codegen directory next to the edited ``gen_instances.py``), plus ``model_dim`` a multiple
of 256 and the GPU kernels' shared memory within every target's limit.  Only the sort
kernels use shared memory whose size depends on the shape: ``ChunkSmem<E>`` in
``csrc/kernels/mxfp4_moe/gpu/sort.h`` holds per-warp uint16 counters plus two int arrays per
expert, ``(2 * kSortWarps + 8) * E + 4 * kSortWarps`` bytes (40 E + 64 with 16 warps),
independent of topk, model_dim and inter.  It must fit the smallest static shared memory of
a block among the targets, 48 KiB (CUDA; AMD's LDS has 64 KiB), i.e. E <= 1227; the
catalog's own bound ``expert <= 1024`` is therefore the binding limit.  ``inter`` is rounded
up to a multiple of 256 first.

Safety: both new texts are staged in temporary files next to their targets (same mode)
and moved into place with ``os.replace``, so no file is ever half written.  If the second
move fails, the first file is restored.  A process killed between the two moves leaves the
shape in one list only; running the same command again completes the other list (it
refuses only a shape that both lists already hold).

Stdlib only (``aiter_aux.jit.paths`` is imported lazily, for the default file locations).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

GEN_LIST = "SHAPES"
OPS_LIST = "MXFP4_MOE_SUPPORTED_SHAPES"
DEFAULT_NOTE = "added by aiter-aux add-shape"
INTER_ALIGN = 256
MODEL_DIM_ALIGN = 256
SMEM_LIMIT_BYTES = 48 * 1024  # smallest per-block static shared memory among the targets
DEFAULT_SORT_WARPS = 16  # kSortWarps in gpu/sort.h, if that file cannot be read

Shape = tuple[int, int, int, int]


class CatalogEditError(ValueError):
    """The shape is invalid, already present / absent, or a list cannot be edited safely."""


@dataclass
class EditResult:
    """What an edit did: the (rounded) shape, the files written with the line of the edit,
    and the new contents of ``SHAPES`` (the catalog the rebuild must use)."""

    action: str  # "added" or "removed"
    shape: Shape
    lines: dict[Path, int] = field(default_factory=dict)
    shapes: list[Shape] = field(default_factory=list)

    def summary(self) -> str:
        where = ", ".join(f"{p}:{n}" for p, n in self.lines.items()) or "no file changed"
        return f"{self.action} {self.shape}: {where}"


def default_files() -> tuple[Path, Path]:
    """(gen_instances.py, moe_mxfp4_aux.py) of the source root (``$AITER_AUX_SOURCE_DIR``
    or the checkout); the ops file falls back to this package's when the root has none."""
    from aiter_aux.jit.paths import source_root

    root = source_root()
    ops = root / "aiter_aux" / "ops" / "moe_mxfp4_aux.py"
    if not ops.is_file():
        ops = Path(__file__).resolve().parent / "ops" / "moe_mxfp4_aux.py"
    return root / "codegen" / "gen_instances.py", ops


def parse_shape(text: str) -> Shape:
    """``"E,MODEL_DIM,INTER,TOPK"`` -> a tuple of 4 ints, INTER rounded up to 256."""
    try:
        parts = tuple(int(p) for p in text.replace(" ", "").split(","))
    except ValueError:
        parts = ()
    if len(parts) != 4:
        raise CatalogEditError(f"expected E,MODEL_DIM,INTER,TOPK (4 ints), got {text!r}")
    return normalize(parts)


def normalize(shape) -> Shape:
    e, d, inter, k = (int(v) for v in shape)
    return (e, d, -(-inter // INTER_ALIGN) * INTER_ALIGN, k)


def _sort_warps(gen_file: Path) -> int:
    sort_h = gen_file.resolve().parents[1] / "csrc/kernels/mxfp4_moe/gpu/sort.h"
    try:
        m = re.search(r"constexpr\s+int\s+kSortWarps\s*=\s*(\d+)\s*;", sort_h.read_text())
    except OSError:
        m = None
    return int(m.group(1)) if m else DEFAULT_SORT_WARPS


def sort_smem_bytes(expert: int, sort_warps: int = DEFAULT_SORT_WARPS) -> int:
    """Shared memory of the GPU sort kernels for ``expert`` experts (``ChunkSmem<E>``)."""
    return 2 * sort_warps * expert + 4 * expert + 4 * expert + 4 * sort_warps


def _instances_module(gen_file: Path):
    name = "aiter_aux_catalog_rules"
    spec = importlib.util.spec_from_file_location(name, gen_file.parent / "instances.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def check_shape(shape: Shape, gen_file: Path) -> list[str]:
    """Rule violations of ``shape`` (empty when it may be added)."""
    errors = [
        err.removeprefix(f"{shape}: ") for err in _instances_module(gen_file).validate_shape(shape)
    ]
    e, d, _inter, _k = shape
    if d % MODEL_DIM_ALIGN and not any("model_dim" in err for err in errors):
        errors.append(f"model_dim must be a multiple of {MODEL_DIM_ALIGN}")
    warps = _sort_warps(gen_file)
    if sort_smem_bytes(e, warps) > SMEM_LIMIT_BYTES:
        errors.append(
            f"the GPU sort kernels need {sort_smem_bytes(e, warps)} bytes of shared "
            f"memory for {e} experts, more than the {SMEM_LIMIT_BYTES} every target provides"
        )
    return errors


def _literal(tree: ast.Module, name: str, path: Path) -> ast.expr:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset":
                value = value.args[0] if len(value.args) == 1 else value
            if isinstance(value, ast.List | ast.Set | ast.Tuple):
                return value
            raise CatalogEditError(f"{path}: {name} is not a list/set literal")
    raise CatalogEditError(f"{path}: no module-level assignment of {name}")


def read_catalog(path: Path, name: str) -> list[Shape]:
    """The tuples of list literal ``name`` in ``path`` (read with ``ast``)."""
    node = _literal(ast.parse(Path(path).read_bytes()), name, path)
    return [tuple(ast.literal_eval(elt)) for elt in node.elts]


def _owned_lines(node: ast.expr, elt: ast.expr, lines: list[str], path: Path) -> range:
    """The lines of ``elt``; it must be alone on them (besides a comma and a comment)."""
    span = range(elt.lineno - 1, elt.end_lineno)
    others = [o for o in node.elts if o is not elt and o.lineno - 1 in span]
    first = lines[span[0]].encode()[: elt.col_offset].decode()
    tail = lines[span[-1]].encode()[elt.end_col_offset :].decode().strip()
    if others or first.strip() or not re.fullmatch(r",?\s*(#.*)?", tail):
        raise CatalogEditError(
            f"{path}:{elt.lineno}: cannot edit safely: the entry shares its line with other "
            "code (keep one tuple per line)"
        )
    return span


def _insert(text: str, path: Path, name: str, shape: Shape, note: str) -> tuple[str, int]:
    node = _literal(ast.parse(text), name, path)
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    if node.elts:
        last = node.elts[-1]
        span = _owned_lines(node, last, lines, path)
        indent = re.match(r"\s*", lines[span[0]]).group()
        end = lines[span[-1]]
        cut = len(end.encode()[: last.end_col_offset].decode())
        if not end[cut:].lstrip().startswith(","):
            lines[span[-1]] = end[:cut] + "," + end[cut:]
        at = span[-1] + 1
    else:
        at = node.end_lineno - 1
        if node.lineno == node.end_lineno or lines[at].strip() not in ("]", "}", ")", "})"):
            raise CatalogEditError(f"{path}: {name} is empty and on one line; open it first")
        indent = re.match(r"\s*", lines[at]).group() + "    "
    lines.insert(at, f"{indent}{shape},  # {note}{eol}")
    return "".join(lines), at + 1


def _remove(text: str, path: Path, name: str, shape: Shape) -> tuple[str, int]:
    node = _literal(ast.parse(text), name, path)
    lines = text.splitlines(keepends=True)
    hits = [elt for elt in node.elts if tuple(ast.literal_eval(elt)) == shape]
    drop = sorted({i for elt in hits for i in _owned_lines(node, elt, lines, path)})
    for i in reversed(drop):
        del lines[i]
    return "".join(lines), hits[0].lineno


def _commit(new_texts: dict[Path, str], old_texts: dict[Path, str]) -> None:
    """Stage every new text next to its file, then move them into place; on a failure,
    restore the files already moved (with ``os.rename``) and re-raise."""
    from aiter_aux.jit.paths import codegen_module

    stage = codegen_module("writer").stage  # the project's one atomic-write helper
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in new_texts.items():
            staged.append((path, stage(path, text.encode(), path.stat().st_mode & 0o7777)))
        done: list[Path] = []
        try:
            for path, tmp in staged:
                os.replace(tmp, path)
                done.append(path)
        except BaseException:
            for path in done:
                mode = path.stat().st_mode & 0o7777
                os.rename(stage(path, old_texts[path].encode(), mode, fsync=False), path)
            raise
    finally:
        for _path, tmp in staged:
            tmp.unlink(missing_ok=True)


def _files(gen_file, ops_file) -> dict[Path, str]:
    if gen_file is None or ops_file is None:
        default_gen, default_ops = default_files()
        gen_file, ops_file = gen_file or default_gen, ops_file or default_ops
    return {Path(gen_file): GEN_LIST, Path(ops_file): OPS_LIST}


def _edit(action: str, shape, note: str | None, gen_file, ops_file) -> EditResult:
    shape = normalize(shape)
    files = _files(gen_file, ops_file)
    gen = next(iter(files))
    old = {path: path.read_bytes().decode() for path in files}
    present = {path: shape in read_catalog(path, name) for path, name in files.items()}
    result = EditResult(action, shape)
    new: dict[Path, str] = {}
    if action == "added":
        errors = check_shape(shape, gen)
        if errors:
            raise CatalogEditError(f"cannot add {shape}: " + "; ".join(errors))
        if all(present.values()):
            raise CatalogEditError(
                f"{shape} is already in the catalog ({' and '.join(map(str, files))}); "
                "nothing to add (aiter-aux list shows the catalog)"
            )
        note = " ".join((note or "").split()) or DEFAULT_NOTE
        for path, name in files.items():
            if not present[path]:
                new[path], result.lines[path] = _insert(old[path], path, name, shape, note)
    else:
        if not any(present.values()):
            raise CatalogEditError(f"{shape} is not in the catalog; nothing to remove")
        if read_catalog(gen, GEN_LIST) == [shape]:
            raise CatalogEditError(
                f"{shape} is the only catalog shape; the catalog cannot be empty"
            )
        for path, name in files.items():
            if present[path]:
                new[path], result.lines[path] = _remove(old[path], path, name, shape)
    for path, name in files.items():  # re-parse every edit before anything is written
        want = [s for s in read_catalog(path, name) if s != shape]
        want += [shape] if action == "added" else []
        got = [tuple(ast.literal_eval(e)) for e in _literal(ast.parse(new.get(path, old[path])),
                                                            name, path).elts]  # fmt: skip
        if sorted(got) != sorted(want):
            raise CatalogEditError(f"{path}: the edit of {name} did not parse back as expected")
    _commit(new, old)
    result.shapes = read_catalog(gen, GEN_LIST)
    return result


def add_shape(shape, note: str | None = None, *, gen_file=None, ops_file=None) -> EditResult:
    """Add ``shape`` (inter rounded up to 256) to both lists, with comment ``note``.  Raises
    :class:`CatalogEditError` for an invalid shape or one that both lists already hold."""
    return _edit("added", shape, note, gen_file, ops_file)


def remove_shape(shape, *, gen_file=None, ops_file=None) -> EditResult:
    """Remove ``shape`` (inter rounded up to 256) from both lists.  Raises
    :class:`CatalogEditError` when neither list holds it or it is the last shape."""
    return _edit("removed", shape, None, gen_file, ops_file)
