"""Write (or check) the sources generated from the op table and the limits.

    python codegen/gen_sources.py           # rewrite the generated files
    python codegen/gen_sources.py --check   # exit 1 if one is out of date (a test runs it)

The generated files are checked in and stamped "generated ... do not edit":
``aiter_aux/validation/_checks.py`` and ``aiter_aux/ops/_ops.py`` (:mod:`codegen.gen_python`)
and ``csrc/kernels/mxfp4_moe/aiter_aux_limits.h`` (:mod:`codegen.limits`).  The torch
binding is generated at build time instead (templates/binding.j2), into the build
directory.  It also runs ``scripts/gen_api_md.py`` (docs/api.md, from the generated
wrappers): after editing the op table, this one command regenerates everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a script: load our package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "codegen"  # noqa: A001

from .gen_python import render_checks, render_ops  # noqa: E402
from .limits import render_header  # noqa: E402
from .ops import OPS  # noqa: E402
from .validate import validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {
    "aiter_aux/validation/_checks.py": render_checks,
    "aiter_aux/ops/_ops.py": render_ops,
    "csrc/kernels/mxfp4_moe/aiter_aux_limits.h": render_header,
}


def _black(text: str, rel: str) -> str:
    """``text`` as black formats it (the project's style), if black is installed."""
    cmd = [sys.executable, "-m", "black", "-q", "--stdin-filename", str(ROOT / rel), "-"]
    try:
        r = subprocess.run(cmd, input=text, capture_output=True, text=True, check=True, cwd=ROOT)
    except (OSError, subprocess.CalledProcessError):
        return text
    return r.stdout


def rendered() -> dict[str, str]:
    validate(OPS)
    out = {}
    for rel, render in TARGETS.items():
        text = render()
        out[rel] = _black(text, rel) if rel.endswith(".py") else text
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check, write nothing")
    args = ap.parse_args(argv)
    stale = []
    for rel, text in rendered().items():
        path = ROOT / rel
        old = path.read_text() if path.exists() else None
        if old != text:
            stale.append(rel)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("out of date (run python codegen/gen_sources.py): " + ", ".join(stale))
        return 1
    print(("written: " + ", ".join(stale)) if stale else "all generated sources are current")
    # docs/api.md is generated from the wrappers' signatures and docstrings (imports torch)
    api = [sys.executable, str(ROOT / "scripts" / "gen_api_md.py")]
    return subprocess.run(api + (["--check"] if args.check else []), cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
