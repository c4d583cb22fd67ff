"""Add or remove one model shape in both catalog lists, as minimal text edits.

The catalog lives in two Python list literals that must agree (the AST test
``op_tests/test_mxfp4_moe_aux_codegen.py`` checks it): ``SHAPES`` in
``codegen/catalog.py`` and ``MXFP4_MOE_SUPPORTED_SHAPES`` in
``aiter_aux/ops/moe_mxfp4_aux.py``, one ``(expert, model_dim, inter_rounded, topk)`` tuple
per line with a comment naming its model.  :func:`add_shape` inserts one such line into each
list, :func:`remove_shape` deletes the entry's line; nothing else in either file changes,
comments and formatting included.

Reading (:func:`read_entries`) uses ``ast`` and sees every entry or refuses the file with a
message naming the line: the list must be assigned once at module level and never changed
elsewhere (``SHAPES += [...]``, ``SHAPES.append(...)``), each entry must be a literal tuple of
4 integers (not ``256 * 2``), and no entry may appear twice.

Where a new line goes: after the last entry of the same model (same expert, model_dim and
topk), else after the last entry of the same model_dim, else at the end.  Its comment is the
required note (the model's name), plus ``(inter X -> Y)`` when inter was rounded up.

Rules for a new shape: every field positive and within a 32-bit int
(:func:`aiter_aux.shapes.range_errors`), then ``validate_shape`` of the edited
``codegen/catalog.py`` (the rules live next to the list): expert in
[1, 1024], model_dim and inter positive multiples of 256 up to what the kernels compile
(``codegen/limits.py``), topk in [1, min(expert, 255)].
The GPU sort's shared memory needs no separate check here: ``gpu/sort.h`` asserts at compile
time that every sort path's shared-memory struct fits 48 KiB for 1024 experts, the largest
count this rule admits.

Safety: the whole read-edit-replace of both files runs under a ``filelock`` lock
(``.aiter_aux_catalog.lock`` in the source root), so concurrent edits never lose one; the
CLI's rebuild of the edited catalog runs under it too (``then``), so the module an edit
publishes is the catalog on disk; a rebuild that fails undoes an add.  Both
new texts are staged next to their targets and moved into place with ``os.replace``; if the
second move fails the first file is restored.  A process killed between the two moves leaves
the shape in one list only; running the same command again completes the other list.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from .shapes import Shape, normalize, range_errors

CATALOG_LIST = "SHAPES"
OPS_LIST = "MXFP4_MOE_SUPPORTED_SHAPES"
LOCK_NAME = ".aiter_aux_catalog.lock"
_MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse",
             "add", "update", "discard", "difference_update", "intersection_update",
             "symmetric_difference_update", "__setitem__", "__delitem__", "__iadd__"}  # fmt: skip


class CatalogEditError(ValueError):
    """The shape is invalid, already present / absent, or a list cannot be edited safely."""


@dataclass(frozen=True)
class Entry:
    """One catalog line: its shape, first and last line (1-based) and comment text."""

    shape: Shape
    line: int
    end_line: int
    comment: str


@dataclass
class EditResult:
    """What an edit did: the (rounded) shape, the files written with the line of the edit,
    and the new contents of ``SHAPES`` (the catalog the rebuild must use)."""

    action: str  # "added", "removed" or "present" (add_shape's exist_ok)
    shape: Shape
    lines: dict[Path, int] = field(default_factory=dict)
    shapes: list[Shape] = field(default_factory=list)
    comment: str = ""

    def summary(self) -> str:
        where = ", ".join(f"{p}:{n}" for p, n in self.lines.items()) or "no file changed"
        note = f"  # {self.comment}" if self.comment else ""
        return f"{self.action} {self.shape}{note}: {where}"


def default_files() -> tuple[Path, Path]:
    """(codegen/catalog.py, moe_mxfp4_aux.py) of the source root (``$AITER_AUX_SOURCE_DIR``
    or the checkout); the ops file falls back to this package's when the root has none."""
    from aiter_aux.jit.paths import source_root

    root = source_root()
    ops = root / "aiter_aux" / "ops" / "moe_mxfp4_aux.py"
    if not ops.is_file():
        ops = Path(__file__).resolve().parent / "ops" / "moe_mxfp4_aux.py"
    return root / "codegen" / "catalog.py", ops


def check_shape(shape: Shape, catalog_file: Path) -> list[str]:
    """Rule violations of ``shape`` (empty when it may be added)."""
    errors = range_errors(shape)
    if errors:  # validate_shape's messages would repeat these
        return errors
    from aiter_aux.jit.paths import catalog_on_disk  # the rules of the edited file

    rules = catalog_on_disk(catalog_file)
    return [err.removeprefix(f"{shape}: ") for err in rules.validate_shape(shape)]


# ------------------------------------------------------------------------------ reading
def _refuse(path: Path, node: ast.AST, what: str) -> CatalogEditError:
    return CatalogEditError(f"{path}:{node.lineno}: {what}")


def _literal(tree: ast.Module, name: str, path: Path) -> ast.expr:
    """The list/set literal assigned to ``name``, after checking that nothing else in the
    file assigns or changes ``name``."""
    assigns = [
        node for node in tree.body
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                 for t in node.targets))
        or (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and node.target.id == name and node.value is not None)
    ]  # fmt: skip
    if not assigns:
        raise CatalogEditError(f"{path}: no module-level assignment of {name}")
    if len(assigns) > 1:
        lines = ", ".join(str(a.lineno) for a in assigns)
        raise _refuse(path, assigns[1], f"{name} is assigned more than once (lines {lines})")
    own = {id(t) for t in getattr(assigns[0], "targets", [getattr(assigns[0], "target", None)])}
    for node in ast.walk(tree):
        changed = (
            (isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == name)
            or (isinstance(node, ast.Name) and node.id == name
                and isinstance(node.ctx, ast.Store | ast.Del) and id(node) not in own)
            or (isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == name
                and node.attr in _MUTATORS)
            or (isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == name
                and isinstance(node.ctx, ast.Store | ast.Del))
        )  # fmt: skip
        if changed:
            raise _refuse(path, node, f"{name} is changed outside its literal; the catalog "
                          "must be the one literal (move the entries into it)")  # fmt: skip
    value = assigns[0].value
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset":
        value = value.args[0] if len(value.args) == 1 and not value.keywords else value
    if not isinstance(value, ast.List | ast.Set | ast.Tuple):
        raise _refuse(path, value, f"{name} is not a list/set literal")
    return value


def _entry_shape(elt: ast.expr, path: Path) -> Shape:
    ok = (
        isinstance(elt, ast.Tuple)
        and len(elt.elts) == 4
        and all(isinstance(v, ast.Constant) and type(v.value) is int for v in elt.elts)
    )
    if not ok:
        raise _refuse(path, elt, f"entry {ast.unparse(elt)!r} is not a literal tuple of 4 "
                      "integers; write the values (e.g. 512, not 256 * 2)")  # fmt: skip
    return tuple(v.value for v in elt.elts)  # type: ignore[return-value]


def _parse(text: str, path: Path, name: str) -> tuple[ast.expr, list[Entry]]:
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise CatalogEditError(f"{path}:{e.lineno}: not valid Python ({e.msg})") from None
    node = _literal(tree, name, path)
    lines = text.splitlines()
    entries, seen = [], {}
    for elt in node.elts:
        shape = _entry_shape(elt, path)
        if shape in seen:
            raise _refuse(path, elt, f"{shape} is listed twice (also line {seen[shape]})")
        seen[shape] = elt.lineno
        tail = lines[elt.end_lineno - 1].encode()[elt.end_col_offset :].decode()
        comment = tail.split("#", 1)[1].strip() if "#" in tail else ""
        entries.append(Entry(shape, elt.lineno, elt.end_lineno, comment))
    return node, entries


def read_entries(path: Path, name: str = CATALOG_LIST) -> list[Entry]:
    """The entries of list literal ``name`` in ``path``, in file order."""
    return _parse(Path(path).read_bytes().decode(), Path(path), name)[1]


def read_catalog(path: Path, name: str) -> list[Shape]:
    """The tuples of list literal ``name`` in ``path``."""
    return [e.shape for e in read_entries(path, name)]


# ------------------------------------------------------------------------------ editing
def _owned_lines(node: ast.expr, elt: ast.expr, lines: list[str], path: Path) -> range:
    """The lines of ``elt``; it must be alone on them (besides a comma and a comment)."""
    span = range(elt.lineno - 1, elt.end_lineno)
    others = [o for o in node.elts if o is not elt and o.lineno - 1 in span]
    first = lines[span[0]].encode()[: elt.col_offset].decode()
    tail = lines[span[-1]].encode()[elt.end_col_offset :].decode().strip()
    if others or first.strip() or not re.fullmatch(r",?\s*(#.*)?", tail):
        raise _refuse(path, elt, "cannot edit safely: the entry shares its line with other "
                      "code (keep one tuple per line)")  # fmt: skip
    return span


def _anchor(node: ast.expr, shape: Shape) -> ast.expr:
    """The entry the new line follows: the last of the same model, else of the same
    model_dim, else the last entry."""
    e, d, _i, k = shape
    tuples = [(elt, tuple(v.value for v in elt.elts)) for elt in node.elts]
    for same in (lambda s: (s[0], s[1], s[3]) == (e, d, k), lambda s: s[1] == d):
        hits = [elt for elt, s in tuples if same(s)]
        if hits:
            return hits[-1]
    return node.elts[-1]


def _insert(text: str, path: Path, name: str, shape: Shape, comment: str) -> tuple[str, int]:
    node, _ = _parse(text, path, name)
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    if node.elts:
        anchor = _anchor(node, shape)
        span = _owned_lines(node, anchor, lines, path)
        indent = re.match(r"\s*", lines[span[0]]).group()
        end = lines[span[-1]]
        cut = len(end.encode()[: anchor.end_col_offset].decode())
        if not end[cut:].lstrip().startswith(","):
            if anchor is not node.elts[-1]:
                raise _refuse(path, anchor, "cannot edit safely: put the comma after the entry")
            lines[span[-1]] = end[:cut] + "," + end[cut:]
        at = span[-1] + 1
    else:
        at = node.end_lineno - 1
        if node.lineno == node.end_lineno or lines[at].strip() not in ("]", "}", ")", "})"):
            raise CatalogEditError(f"{path}: {name} is empty and on one line; open it first")
        indent = re.match(r"\s*", lines[at]).group() + "    "
    lines.insert(at, f"{indent}{shape},  # {comment}{eol}")
    return "".join(lines), at + 1


def _remove(text: str, path: Path, name: str, shape: Shape) -> tuple[str, int]:
    node, _ = _parse(text, path, name)
    lines = text.splitlines(keepends=True)
    (elt,) = [elt for elt in node.elts if _entry_shape(elt, path) == shape]
    for i in reversed(_owned_lines(node, elt, lines, path)):
        del lines[i]
    return "".join(lines), elt.lineno


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


@contextlib.contextmanager
def catalog_lock(catalog_file: Path, timeout: float | None = None):
    """Hold the catalog lock of the tree of ``catalog_file`` (``<root>/.aiter_aux_catalog.lock``,
    outside codegen/ so that it is no JIT source); a waiter says so on stderr at once and
    waits ``timeout`` seconds (default ``$AITER_AUX_LOCK_TIMEOUT``: an edit may rebuild
    under it)."""
    from filelock import FileLock, Timeout

    from . import env

    timeout = env.get("AITER_AUX_LOCK_TIMEOUT") if timeout is None else timeout

    path = Path(catalog_file).resolve().parents[1] / LOCK_NAME
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"aiter-aux: waiting for another catalog edit ({path})", file=sys.stderr)
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise CatalogEditError(
                f"another catalog edit held {path} for more than {timeout:.0f} s"
            ) from None
    try:
        yield
    finally:
        lock.release()


def _files(catalog_file, ops_file) -> dict[Path, str]:
    if catalog_file is None or ops_file is None:
        default_catalog, default_ops = default_files()
        catalog_file, ops_file = catalog_file or default_catalog, ops_file or default_ops
    return {Path(catalog_file): CATALOG_LIST, Path(ops_file): OPS_LIST}


MAX_NOTE_CHARS = 200  # a catalog comment names a model and a layout


def text_error(text: str, max_chars: int) -> str | None:
    """Why ``text`` may not go into a catalog comment (too long, control, bidi or line
    separator characters that would hide or break the line, or lone surrogates, which the
    UTF-8 file cannot hold), or None."""
    if len(text) > max_chars:
        return f"is {len(text)} characters long (at most {max_chars})"
    bad = [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        return f"holds control or bidi characters ({', '.join(f'U+{ord(c):04X}' for c in bad[:3])})"
    lone = [c for c in text if unicodedata.category(c) == "Cs"]  # e.g. os.fsdecode(b"\xff")
    if lone:
        codes = ", ".join(f"U+{ord(c):04X}" for c in lone[:3])
        return f"holds lone surrogates that UTF-8 cannot write ({codes}; bytes that are not UTF-8?)"
    return None


def _comment(given: Shape, shape: Shape, note: str | None) -> str:
    why = text_error(note or "", MAX_NOTE_CHARS)  # before spaces are collapsed: a tab or
    if why:  # newline is a control character, refused as the docs say
        raise CatalogEditError(f"--note {why}: it becomes the catalog line's comment")
    note = " ".join((note or "").split())
    if not note:
        raise CatalogEditError(
            "name the model in --note (e.g. --note 'GLM-4.5 TP4'); write 'no public model' "
            "when there is none"
        )
    why = text_error(note, MAX_NOTE_CHARS)
    if why:
        raise CatalogEditError(f"--note {why}: it becomes the catalog line's comment")
    return note + (f" (inter {given[2]} -> {shape[2]})" if given[2] != shape[2] else "")


def _edit(action: str, given, note: str | None, catalog_file, ops_file, then,
          exist_ok: bool = False) -> EditResult:  # fmt: skip
    given = tuple(int(v) for v in given)
    errors = range_errors(given)
    if errors:
        verb = "add" if action == "added" else "remove"
        raise CatalogEditError(f"cannot {verb} {given}: " + "; ".join(errors))
    shape = normalize(given)
    files = _files(catalog_file, ops_file)
    catalog = next(iter(files))
    with catalog_lock(catalog):
        old = {path: path.read_bytes().decode() for path in files}
        present = {p: shape in [e.shape for e in _parse(old[p], p, n)[1]] for p, n in files.items()}
        result = EditResult(action, shape)
        new: dict[Path, str] = {}
        if action == "added":
            errors = check_shape(shape, catalog)
            if errors:
                raise CatalogEditError(f"cannot add {shape}: " + "; ".join(errors))
            if all(present.values()) and exist_ok:  # added meanwhile: nothing to do
                result.action = "present"
                result.shapes = read_catalog(catalog, CATALOG_LIST)
                return result
            if all(present.values()):
                raise CatalogEditError(
                    f"{shape} is already in the catalog ({' and '.join(map(str, files))}); "
                    "nothing to add (aiter-aux list shows the catalog)"
                )
            result.comment = _comment(given, shape, note)
            for path, name in files.items():
                if not present[path]:
                    new[path], result.lines[path] = _insert(old[path], path, name, shape,
                                                            result.comment)  # fmt: skip
        else:
            if not any(present.values()):
                what = str(shape) if given == shape else f"{given} (inter rounded: {shape})"
                raise CatalogEditError(f"{what} is not in the catalog; nothing to remove")
            if [e.shape for e in _parse(old[catalog], catalog, CATALOG_LIST)[1]] == [shape]:
                raise CatalogEditError(
                    f"{shape} is the only catalog shape; the catalog cannot be empty"
                )
            for path, name in files.items():
                if present[path]:
                    new[path], result.lines[path] = _remove(old[path], path, name, shape)
        for path, name in files.items():  # re-parse every edit before anything is written
            want = {e.shape for e in _parse(old[path], path, name)[1]} - {shape}
            want |= {shape} if action == "added" else set()
            got = [e.shape for e in _parse(new.get(path, old[path]), path, name)[1]]
            if sorted(got) != sorted(want):
                raise CatalogEditError(f"{path}: the edit of {name} did not parse back as expected")
        _commit(new, old)
        result.shapes = read_catalog(catalog, CATALOG_LIST)
        if then is not None:
            try:
                then(result)
            except Exception:
                if action == "added":  # the catalog on disk stays one that builds
                    _commit({path: old[path] for path in new}, new)
                raise
    return result


def add_shape(
    shape,
    note: str | None = None,
    *,
    catalog_file=None,
    ops_file=None,
    then=None,
    exist_ok: bool = False,
) -> EditResult:
    """Add ``shape`` (inter rounded up to 256) to both lists, commented with ``note`` (the
    model's name; required).  ``then(result)``, if given, runs after the edit while the
    catalog lock is still held (the CLI's rebuild: no other edit changes the catalog before
    it is built and published); if ``then`` raises, the edit is undone (both files as
    before) and the error re-raised.  Raises :class:`CatalogEditError` for an invalid shape,
    a missing note, or a shape that both lists already hold; with ``exist_ok`` such a shape
    is no error: the result's action is ``"present"``, nothing is written and ``then`` does
    not run (``--from-config``: a concurrent call of the same model added it meanwhile)."""
    return _edit("added", shape, note, catalog_file, ops_file, then, exist_ok)


def remove_shape(shape, *, catalog_file=None, ops_file=None, then=None) -> EditResult:
    """Remove ``shape`` (inter rounded up to 256) from both lists; ``then`` as for
    :func:`add_shape`.  Raises :class:`CatalogEditError` when neither list holds it or it
    is the last shape."""
    return _edit("removed", shape, None, catalog_file, ops_file, then)
