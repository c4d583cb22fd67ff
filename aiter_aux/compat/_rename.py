"""Errors in the caller's words: the native op's argument names replaced by the peer's."""

from __future__ import annotations

import re


def renamed(e: Exception, names: dict[str, str]) -> Exception:
    """``e`` with each word of ``names`` in its message replaced by its value (the peer's
    parameter name); returns ``e``."""
    if e.args and isinstance(e.args[0], str):
        pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
        e.args = (re.sub(pattern, lambda m: names[m.group(1)], e.args[0]), *e.args[1:])
    return e
