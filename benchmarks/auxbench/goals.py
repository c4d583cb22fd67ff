"""The performance goals: ``benchmarks/goals.json`` holds them (the thresholds and the peers'
moe_sort times); :func:`evaluate` checks bench rows against them and returns PASS / FAIL /
SKIP lines, each naming its worst case."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from .report import FUSED_PARTS, Row, set_fused_parts, shape_str

GOALS_FILE = Path(__file__).resolve().parents[1] / "goals.json"

METRICS = ("us", "pct_copy", "pct_same_copy", "x_parts", "x_eager", "x_compiled", "x_peer",
           "monotonic")  # fmt: skip

#: The words after a goal's bound, per metric (x_parts and x_peer name their parts).
_UNITS = {
    "us": " us",
    "pct_copy": "% of copy BW",
    "pct_same_copy": "% of a same-bytes copy",
    "x_eager": "x faster than eager",
    "x_compiled": "x faster than torch.compile",
}
#: The Row field a metric bounds, where it is one.
_ROW_FIELDS = {"us": "ours_us", "pct_copy": "pct_copy", "pct_same_copy": "pct_of_same_copy",
               "x_parts": "x_parts", "x_eager": "x_eager", "x_compiled": "x_compiled"}  # fmt: skip


#: A goal's own parts (``"parts"``) are combined by ``"combine"`` (default max).
_COMBINE = {"max": max, "sum": sum}


def goal_parts(g: dict) -> tuple[tuple[str, ...], object]:
    """The parts an x_parts goal divides by and how they combine: the goal's own ``parts``
    (``combine``: max or sum) where it names them, else the op's FUSED_PARTS."""
    if "parts" in g:
        return tuple(g["parts"]), _COMBINE[g.get("combine", "max")]
    return FUSED_PARTS[g["op"]]


@cache
def load(path: Path = GOALS_FILE) -> dict:
    """The goals file, checked: every goal has a known metric and exactly one bound."""
    data = json.loads(Path(path).read_text())
    for section in data["sections"]:
        for g in section["goals"]:
            if g["metric"] not in METRICS or ("max" in g) == ("min" in g):
                raise ValueError(f"{path}: bad goal {g}")
            if ("parts" in g or "combine" in g) and (
                g["metric"] != "x_parts" or g.get("combine", "max") not in _COMBINE
            ):
                raise ValueError(f"{path}: 'parts' / 'combine' need metric x_parts: {g}")
    return data


def same_copy_ops(data: dict | None = None) -> set[str]:
    """The ops judged against the copy bandwidth: the bench also times a copy kernel of the
    same bytes for them (``copy_same_us``)."""
    data = data or load()
    return {
        g["op"]
        for s in data["sections"]
        for g in s["goals"]
        if g["metric"] in ("pct_copy", "pct_same_copy")
    }


def faster_peer_us(e: int, topk: int, m: int, data: dict | None = None) -> float | None:
    """The faster peer's moe_sort time at (E, topk, M); None where the peer table has none."""
    table = (data or load())["peer_moe_sort_us"]
    if m not in table["tokens"]:
        return None
    i = table["tokens"].index(m)
    times = [r["us"][i] for r in table["rows"] if (r["expert"], r["topk"]) == (e, topk)]
    return min(times) if times else None


def peer_names(data: dict | None = None) -> list[str]:
    return list(dict.fromkeys(r["peer"] for r in (data or load())["peer_moe_sort_us"]["rows"]))


def _num(v: float) -> str:
    return f"{v:g}"


def _tokens_text(t: dict) -> str:
    if "eq" in t:
        return f"M={t['eq']}"
    if "range" in t:
        return f"M={t['range'][0]}-{t['range'][1]}"
    return f"M<={t['max']}" if "max" in t else f"M>={t['min']}"


def _tokens_ok(t: dict, m: int) -> bool:
    if "eq" in t:
        return m == t["eq"]
    lo, hi = t.get("range", (t.get("min", 0), t.get("max", float("inf"))))
    return lo <= m <= hi


def title(g: dict, data: dict | None = None) -> str:
    """A goal in words: ``[phase] [M..., topk=...]: op [(what)] <bound> <metric>``."""
    who = "every op" if g["op"] == "*" else g["op"]
    if "what" in g:
        who += f" ({g['what']})"
    cmp, limit = ("<=", g["max"]) if "max" in g else (">=", g["min"])
    m = g["metric"]
    if m == "monotonic":
        text = f"{who} monotonic in M: time {cmp} {_num(limit)} x the largest at a smaller M"
    else:
        if m == "x_parts":
            parts, combine = goal_parts(g)
            unit = f" x {'max' if combine is max else 'sum'}({', '.join(parts)})"
        elif m == "x_peer":
            unit = f" x the faster peer ({', '.join(peer_names(data))})"
        else:
            unit = _UNITS[m]
        text = f"{who} {cmp} {_num(limit)}{unit}"
    where = [_tokens_text(g["tokens"])] if "tokens" in g else []
    if "topk" in g:
        where.append(f"topk={g['topk']}")
    head = " ".join(x for x in (g.get("phase"), ", ".join(where)) if x)
    return f"{head}: {text}" if head else text


def _largest_before(rows: list[Row], r: Row) -> float | None:
    before = [
        x.ours_us
        for x in rows
        if x.op == r.op and x.shape == r.shape and x.tokens < r.tokens and x.ours_us
    ]
    return max(before) if before else None


def _value(g: dict, rows: list[Row], data: dict):
    """The function of a row that goal ``g`` bounds (None: the row is left out)."""
    m = g["metric"]
    if m == "x_parts" and "parts" in g:
        parts, combine = goal_parts(g)
        us = {(r.op, r.shape, r.tokens): r.ours_us for r in rows}

        def vs_own_parts(r: Row) -> float | None:
            times = [us.get((p, r.shape, r.tokens)) for p in parts]
            if not r.ours_us or not all(times):
                return None
            return r.ours_us / combine(times)

        return vs_own_parts
    if m in _ROW_FIELDS:
        field = _ROW_FIELDS[m]
        return lambda r: getattr(r, field)

    if m == "x_peer":

        def vs_peer(r: Row) -> float | None:
            p = faster_peer_us(r.shape[0], r.shape[3], r.tokens, data)
            return r.ours_us / p if p and r.ours_us else None

        return vs_peer

    def drop(r: Row) -> float | None:
        before = _largest_before(rows, r)
        return r.ours_us / before if before and r.ours_us else None

    return drop


def goal_line(name: str, sel: list[Row], value, ok, unit: str, worst_is_max: bool) -> str:
    """One goal as a PASS/FAIL/SKIP line: ``value(row)`` of each selected row (None: left
    out) must satisfy ``ok``; the line names the worst case (the largest value when
    ``worst_is_max``, else the smallest) and counts the failing cases."""
    sel = [r for r in sel if value(r) is not None]
    if not sel:
        return f"SKIP  {name}: no measured case"
    worst = (max if worst_is_max else min)(sel, key=value)
    bad = [r for r in sel if not ok(value(r))]
    where = f"{worst.op} {shape_str(worst.shape)} M={worst.tokens}"
    status = "PASS" if not bad else "FAIL"
    extra = f", {len(bad)}/{len(sel)} cases fail" if bad else f", {len(sel)} cases"
    return f"{status}  {name}: worst {value(worst):.2f}{unit} ({where}){extra}"


def _copy_note(sel: list[Row], pct: float) -> list[str]:
    under = [r for r in sel if (r.same_copy_pct_bw or 100.0) < pct]
    if not under:
        return []
    cases = ", ".join(
        f"{shape_str(r.shape)} M={r.tokens}: copy {r.same_copy_pct_bw:.0f}%, "
        f"ours {r.pct_of_same_copy:.0f}% of it"
        for r in under
    )
    return [
        f"NOTE    a copy of the same bytes stays under {_num(pct)}% itself in "
        f"{len(under)} case(s) ({cases})"
    ]


UNITS = {"us": " us", "pct_copy": "%", "pct_same_copy": "%"}


def evaluate(
    rows: list[Row], have_compiled: bool, data: dict | None = None
) -> list[tuple[str, list[str]]]:
    """Every goal of the goals file checked against ``rows``: (section title, its lines)."""
    data = data or load()
    set_fused_parts(rows)
    out = []
    for section in data["sections"]:
        lines = []
        for g in section["goals"]:
            name = title(g, data)
            if "skip" in g:
                lines.append(f"SKIP  {name}: {g['skip']}")
                continue
            if g["metric"] == "x_compiled" and not have_compiled:
                lines.append(f"SKIP  {name}: compiled peer not run")
                continue
            sel = [
                r
                for r in rows
                if g["op"] in ("*", r.op)
                and _tokens_ok(g.get("tokens", {}), r.tokens)
                and g.get("topk", r.shape[3]) == r.shape[3]
            ]
            upper = "max" in g
            limit = g["max"] if upper else g["min"]
            ok = (lambda v, t=limit: v <= t) if upper else (lambda v, t=limit: v >= t)
            unit = UNITS.get(g["metric"], "x")
            lines.append(goal_line(name, sel, _value(g, rows, data), ok, unit, upper))
            if g["metric"] == "pct_copy":
                lines += _copy_note(sel, limit)
            if g["metric"] == "x_compiled":
                na = [r for r in sel if r.x_compiled is None]
                if na:
                    lines.append(
                        f"NOTE  {len(na)} case(s) without a compiled time (n/a) are not in "
                        "this check"
                    )
        out.append((section["title"], lines))
    return out
