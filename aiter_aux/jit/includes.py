"""What a translation unit includes of the kernel sources, and the digest of those bytes.

Each compile command carries the digest of exactly the files its source includes
(``-DAITER_AUX_SOURCES_DIGEST=...``): ninja rebuilds an object whenever its command line
changes, so an edit of a header recompiles every object that includes it even when the
file's mtime went backwards, and no other object.  The include graph is read from the
sources themselves (``#include "..."`` lines, resolved next to the including file, then in
the kernels directory as ``-I`` does); system headers (``<...>``) are the toolchain's and
enter its fingerprint instead.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .paths import kernels_dir

_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.M)


def closure(source: Path, text: bytes | None = None) -> list[Path]:
    """The kernel files ``source`` includes, directly or not, sorted (``source`` itself
    excluded); ``text`` is its bytes when the caller has them."""
    roots = (kernels_dir(),)
    seen: dict[Path, bytes] = {}
    todo = [(Path(source), text if text is not None else Path(source).read_bytes())]
    while todo:
        path, data = todo.pop()
        for name in _INCLUDE.findall(data):
            rel = name.decode()
            for base in (path.parent, *roots):
                found = (base / rel).resolve()
                if found.is_file():
                    break
            else:
                continue  # not ours (or missing: the compiler says so)
            if found not in seen:
                seen[found] = found.read_bytes()
                todo.append((found, seen[found]))
    return sorted(seen)


def digest(source: Path, text: bytes | None = None) -> str:
    """sha256 over the path (relative to the kernels directory) and bytes of every file of
    :func:`closure` of ``source``."""
    root = kernels_dir().resolve()
    h = hashlib.sha256()
    for f in closure(source, text):
        rel = f.relative_to(root).as_posix() if f.is_relative_to(root) else f.name
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
