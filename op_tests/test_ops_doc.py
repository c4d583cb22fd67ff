"""docs/ops.md (the spec in words) names every argument of each op as the reference
(the executable spec) takes it: the section headings and the Python API list."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ref = pytest.importorskip("aiter_aux.reference")

DOC = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
_SIG = re.compile(r"^(?:## )?([a-z0-9_]+)\((.*?)\)(?:\s|$|:| ->)", re.M)


def _documented() -> list[tuple[str, list[str]]]:
    """(function, its argument names with ``*`` where keywords begin) as docs/ops.md writes
    them, for each signature of a function the reference has."""
    out = []
    for name, args in _SIG.findall(DOC.read_text()):
        if name.startswith("_") or not callable(getattr(ref, name, None)):
            continue
        names = [a.split("=")[0].split(":")[0].strip() for a in args.split(",") if a.strip()]
        out.append((name, names))
    return out


def _actual(name: str) -> list[str]:
    names = []
    for p in inspect.signature(getattr(ref, name)).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in names:
            names.append("*")
        names.append(p.name)
    return names


def test_every_documented_signature_is_the_references():
    documented = _documented()
    assert len({n for n, _ in documented}) >= 15, documented  # the headings and the API list
    wrong = [(n, args, _actual(n)) for n, args in documented if args != _actual(n)]
    assert wrong == []
