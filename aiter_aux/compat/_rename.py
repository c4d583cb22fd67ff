"""Errors in the caller's words: the native op's argument names replaced by the peer's."""

from __future__ import annotations

import re


def renamed(e: Exception, names: dict[str, str]) -> Exception:
    """``e`` with each name of ``names`` (a word, or a term such as ``num_tokens (M)``) in its
    message replaced by its value (the peer's words); returns ``e``.  While ``torch.compile``
    traces, ``e`` is returned as it is (in the op's words): dynamo cannot rewrite an
    exception's message."""
    import torch

    if torch.compiler.is_compiling():
        return e
    if e.args and isinstance(e.args[0], str):
        pattern = r"(?<!\w)(" + "|".join(map(re.escape, names)) + r")(?!\w)"
        e.args = (re.sub(pattern, lambda m: names[m.group(1)], e.args[0]), *e.args[1:])
    return e
