"""benchmarks/bench_aux.py on the CPU: the default cases, the `x parts` column (a fused op's
time over its parts') and the goal lines of benchmarks/goals.json on synthetic timings whose
expected values are worked out by hand below, and a `--device cpu --quick` smoke run."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from auxbench import cases, goals, report  # noqa: E402
from auxbench.report import Row  # noqa: E402

A = (257, 7168, 256, 9)  # E/topk 257/9: vLLM and SGLang in the peer table
B = (256, 7168, 256, 8)  # 256/8: SGLang only


def test_default_cases():
    from aiter_aux.ops.moe_mxfp4_aux import is_mxfp4_moe_shape_supported

    assert cases.DEFAULT_TOKENS == (
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536
    )  # fmt: skip
    assert B in cases.DEFAULT_SHAPES and A in cases.DEFAULT_SHAPES
    assert len(set(cases.DEFAULT_SHAPES)) == len(cases.DEFAULT_SHAPES)
    for shape in cases.DEFAULT_SHAPES + cases.QUICK_SHAPES:
        assert is_mxfp4_moe_shape_supported(*shape), shape
    # --quick stays a smoke test
    assert len(cases.QUICK_SHAPES) * len(cases.QUICK_TOKENS_CPU) <= 6
    assert max(cases.QUICK_TOKENS_CPU) <= 128


def _rows() -> list[Row]:
    """Synthetic timings (µs).  The expected ratios and goal lines in the tests are computed
    by hand from these numbers."""
    t = [
        # moe_sort, shape A: rises with M but for a 2 % dip at 4096 (within 5 %)
        ("moe_sort", A, 1, 1.2),
        ("moe_sort", A, 16, 3.0),
        ("moe_sort", A, 256, 3.9),
        ("moe_sort", A, 1024, 5.0),
        ("moe_sort", A, 4096, 4.9),
        # shape B: 4.5 at M=256 (over 4 us), then 4.0 at 1024 (an 11 % drop)
        ("moe_sort", B, 1, 1.25),
        ("moe_sort", B, 256, 4.5),
        ("moe_sort", B, 1024, 4.0),
        ("mxfp4_quant", A, 1, 2.0),
        ("mxfp4_quant", A, 1024, 8.0),
        ("mxfp4_quant", A, 4096, 30.0),
        ("moe_sort_quant", A, 1, 3.4),
        ("moe_sort_quant", A, 16, 3.6),  # no mxfp4_quant at M=16: no ratio
        ("moe_sort_quant", A, 1024, 8.8),
        ("moe_sort_quant", A, 4096, 31.0),
        ("mxfp8_quant", A, 1024, 4.0),
        ("moe_sort_quant_fp8", A, 1024, 5.1),
        ("moe_sort_scales", A, 1, 1.0),
        ("decode_pipeline", A, 1, 4.0),
        ("moe_scatter_reduce", A, 1, 1.5),
        ("moe_scatter_reduce", B, 1, 1.3),
        ("moe_scatter_reduce", A, 4096, 10.0),
    ]
    rows = [
        Row(op, shape, m, ours_us=us, check="ok", bytes=10**6, copy_bw=4e12)
        for op, shape, m, us in t
    ]
    for r in rows:
        if r.op == "moe_scatter_reduce" and r.tokens == 4096:
            r.copy_same_us = 9.8  # 98 % of the copy's speed
    return rows


def _row(rows, op, shape, m) -> Row:
    (r,) = [r for r in rows if (r.op, r.shape, r.tokens) == (op, shape, m)]
    return r


def test_fused_parts_ratio():
    rows = _rows()
    report.set_fused_parts(rows)
    # moe_sort_quant / max(moe_sort, mxfp4_quant)
    assert _row(rows, "moe_sort_quant", A, 1).parts_us == 2.0  # max(1.2, 2.0)
    assert _row(rows, "moe_sort_quant", A, 1).x_parts == pytest.approx(1.7)  # 3.4 / 2.0
    assert _row(rows, "moe_sort_quant", A, 1024).x_parts == pytest.approx(1.1)  # 8.8 / 8.0
    assert _row(rows, "moe_sort_quant", A, 4096).x_parts == pytest.approx(31 / 30)
    # moe_sort_quant_fp8 / max(moe_sort, mxfp8_quant): the sort is the slower part here
    assert _row(rows, "moe_sort_quant_fp8", A, 1024).parts_us == 5.0
    assert _row(rows, "moe_sort_quant_fp8", A, 1024).x_parts == pytest.approx(1.02)
    # decode_pipeline / (moe_sort_quant + moe_sort_scales) = 4.0 / (3.4 + 1.0)
    assert _row(rows, "decode_pipeline", A, 1).parts_us == pytest.approx(4.4)
    assert _row(rows, "decode_pipeline", A, 1).x_parts == pytest.approx(0.9090909)
    # a part not measured: no ratio; the parts themselves have none
    assert _row(rows, "moe_sort_quant", A, 16).x_parts is None
    assert _row(rows, "moe_sort", A, 1).x_parts is None


def test_fused_parts_in_table_and_csv(tmp_path, capsys):
    rows = _rows()
    report.set_fused_parts(rows)
    report.print_table(rows)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "x parts" in lines[1]
    pipe = [ln for ln in lines if ln.startswith("decode_pipeline")]
    assert len(pipe) == 1 and pipe[0].split()[-2:] == ["0.91", "ok"]
    sq = [ln.split() for ln in lines if ln.startswith("moe_sort_quant ")]
    assert [(c[2], c[-2]) for c in sq] == [("1", "1.70"), ("16", "n/a"), ("1024", "1.10"),
                                           ("4096", "1.03")]  # fmt: skip

    report.write_csv(tmp_path / "r.csv", rows, 32)
    with (tmp_path / "r.csv").open() as f:
        got = {(r["op"], int(r["tokens"]), int(r["expert"])): r for r in csv.DictReader(f)}
    r = got[("moe_sort_quant", 1024, 257)]
    assert (r["parts_us"], r["fused_over_parts"]) == ("8", "1.1")
    r = got[("decode_pipeline", 1, 257)]
    assert (r["parts_us"], r["fused_over_parts"]) == ("4.4", "0.9091")
    r = got[("moe_sort_quant", 16, 257)]
    assert (r["parts_us"], r["fused_over_parts"]) == ("", "")


def _section(title: str, lines: list) -> list[str]:
    (got,) = [ln for t, ln in lines if t == title]
    return got


def test_goal_lines_at_every_batch_size():
    lines = _section("goals at every batch size (H200 figures)", goals.evaluate(_rows(), False))
    a, b = "257,7168,256,9", "256,7168,256,8"
    assert lines == [
        f"PASS  M=1: moe_sort <= 1.3 us: worst 1.25 us (moe_sort {b} M=1), 2 cases",
        f"FAIL  M=256: moe_sort <= 4 us: worst 4.50 us (moe_sort {b} M=256), 1/2 cases fail",
        f"PASS  M=1024: moe_sort <= 6 us: worst 5.00 us (moe_sort {a} M=1024), 2 cases",
        # ours / faster peer: A 1.2/1.56, 3.0/4.16, 3.9/5.06, 5.0/7.59, 4.9/19.24 (all SGLang);
        # B 1.25/1.65, 4.5/4.83 = 0.932 (the one over 0.8), 4.0/7.85
        "FAIL  moe_sort <= 0.8 x the faster peer (vLLM, SGLang): "
        f"worst 0.93x (moe_sort {b} M=256), 1/8 cases fail",
        # time / largest at a smaller M: A 2.5, 1.3, 1.28, 0.98; B 3.6, 0.889
        "FAIL  moe_sort monotonic in M: time >= 0.95 x the largest at a smaller M: "
        f"worst 0.89x (moe_sort {b} M=1024), 1/6 cases fail",
        # 8.8 / 8.0 = 1.10 and 31 / 30 = 1.03
        "FAIL  M>=1024: moe_sort_quant <= 1.05 x max(moe_sort, mxfp4_quant): worst 1.10x "
        f"(moe_sort_quant {a} M=1024), 1/2 cases fail",
        "FAIL  decode M<=64: moe_sort_quant <= 3.5 us: worst 3.60 us "
        f"(moe_sort_quant {a} M=16), 1/2 cases fail",
        "PASS  decode M<=64: decode_pipeline (sort + quant + sorted scales) <= 4.5 us: worst "
        f"4.00 us (decode_pipeline {a} M=1), 1 cases",
        "FAIL  M=1: moe_scatter_reduce <= 1.4 us: worst 1.50 us "
        f"(moe_scatter_reduce {a} M=1), 1/2 cases fail",
        "PASS  prefill M>=4096: moe_scatter_reduce >= 97% of a same-bytes copy: worst 98.00% "
        f"(moe_scatter_reduce {a} M=4096), 1 cases",
        "SKIP  M=16-1024: moe_scatter_reduce <= 0.95 x the faster peer (vLLM, SGLang): the "
        "peers' reduce times are not in this bench's peer table",
    ]


def test_goals_without_cases():
    for _, lines in goals.evaluate([Row("mxfp4_quant", A, 1, ours_us=1.0)], False):
        assert all(ln.startswith("SKIP") for ln in lines)
    n = sum(len(s["goals"]) for s in goals.load()["sections"])
    assert sum(len(ln) for _, ln in goals.evaluate([], False)) == n


def test_fp8_goal_reads_the_parts_ratio():
    # 5.1 / max(5.0, 4.0) = 1.02 <= 1.05
    lines = _section("goals", goals.evaluate(_rows(), have_compiled=False))
    assert (
        "PASS  M>=1024: moe_sort_quant_fp8 <= 1.05 x max(moe_sort, mxfp8_quant): worst 1.02x "
        "(moe_sort_quant_fp8 257,7168,256,9 M=1024), 1 cases"
    ) in lines
    assert "SKIP  every op >= 5x faster than torch.compile: compiled peer not run" in lines


def test_a_goal_names_its_own_parts():
    """route_pipeline over max(moe_route, moe_sort, mxfp4_quant) at the same shape and M: the
    goal's own parts, not FUSED_PARTS' sum; a case without every part is left out."""
    rows = _rows() + [
        Row("moe_route", A, 1024, ours_us=4.0, check="ok"),
        Row("route_pipeline", A, 1024, ours_us=12.0, check="ok"),  # 12 / max(4, 5, 8) = 1.5
        Row("route_pipeline", A, 4096, ours_us=31.5, check="ok"),  # no moe_route at 4096
    ]
    g = {"op": "route_pipeline", "tokens": {"min": 1024}, "metric": "x_parts",
         "parts": ["moe_route", "moe_sort", "mxfp4_quant"], "max": 1.05}  # fmt: skip
    data = {"sections": [{"title": "t", "goals": [g]}], "peer_moe_sort_us": {"rows": []}}
    ((_, lines),) = goals.evaluate(rows, False, data)
    assert lines == [
        "FAIL  M>=1024: route_pipeline <= 1.05 x max(moe_route, moe_sort, mxfp4_quant): worst "
        "1.50x (route_pipeline 257,7168,256,9 M=1024), 1/1 cases fail"
    ]
    ((_, lines),) = goals.evaluate(rows, False, {**data, "sections": [
        {"title": "t", "goals": [{**g, "combine": "sum", "max": 0.8}]}]})  # fmt: skip
    assert (
        lines[0].startswith("PASS  M>=1024: route_pipeline <= 0.8 x sum(") and "0.71x" in lines[0]
    )


def test_goals_file_is_checked(tmp_path):
    """Every goal of goals.json names a bench op (or every op) and a known metric; the ops
    judged against the copy bandwidth are the ones the bench times a same-bytes copy for."""
    data = goals.load()
    for section in data["sections"]:
        for g in section["goals"]:
            assert g["op"] == "*" or g["op"] in cases.OPS, g
    assert goals.same_copy_ops() == {
        "mxfp4_quant", "mxfp8_quant", "moe_scatter_reduce", "moe_scatter_reduce_q",
        "moe_sort_scales",
    }  # fmt: skip
    assert goals.faster_peer_us(257, 9, 1) == 1.56  # SGLang, faster than vLLM's 4.10
    assert goals.faster_peer_us(257, 9, 2) is None
    bad = tmp_path / "goals.json"
    bad.write_text('{"sections": [{"title": "t", "goals": [{"op": "*", "metric": "us"}]}]}')
    with pytest.raises(ValueError, match="bad goal"):
        goals.load(bad)
    bad.write_text('{"sections": [{"title": "t", "goals": [{"op": "moe_sort", "metric": "us", '
                   '"max": 1, "parts": ["moe_sort"]}]}]}')  # fmt: skip
    with pytest.raises(ValueError, match="need metric x_parts"):
        goals.load(bad)


def test_goals_from_a_results_csv(tmp_path):
    """perf_tables.py --goals reads results.csv files back (report.read_csv) and prints the
    same goal lines as the bench for the same rows."""
    import perf_tables

    rows = _rows()
    report.set_fused_parts(rows)
    report.write_csv(tmp_path / "r.csv", rows, 32)
    back = report.read_csv(tmp_path / "r.csv")
    assert [(r.op, r.shape, r.tokens, r.ours_us) for r in back] == [
        (r.op, r.shape, r.tokens, float(f"{r.ours_us:.4g}")) for r in rows
    ]
    text = perf_tables.goal_report([tmp_path / "r.csv"])
    for title, lines in goals.evaluate(rows, False):
        assert f"{title}:" in text
        for ln in lines:
            assert f"  {ln}" in text


def _load_bench_aux():
    spec = importlib.util.spec_from_file_location("bench_aux_cli", BENCH / "bench_aux.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_on_cpu(cpu_module, tmp_path, capsys):
    """The smoke test: `--device cpu --quick`, every op; outputs match, the table has the
    ratio column and the CSV the ratio of each fused op whose parts ran."""
    rc = _load_bench_aux().main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert "x parts" in out and "goals at every batch size" in out
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["check"] for r in rows} == {"ok"}
    assert len({(r["expert"], r["tokens"]) for r in rows}) == len(cases.QUICK_SHAPES) * len(
        cases.QUICK_TOKENS_CPU
    )
    ours = {(r["op"], r["expert"], r["tokens"]): float(r["ours_us"]) for r in rows}
    fused = {
        "moe_sort_quant": lambda e, m: max(ours["moe_sort", e, m], ours["mxfp4_quant", e, m]),
        "moe_sort_quant_fp8": lambda e, m: max(ours["moe_sort", e, m], ours["mxfp8_quant", e, m]),
        "decode_pipeline": lambda e, m: ours["moe_sort_quant", e, m]
        + ours["moe_sort_scales", e, m],
        # the peers' formats over our sort
        "moe_align_vllm": lambda e, m: ours["moe_sort", e, m],
        "moe_align_sglang": lambda e, m: ours["moe_sort", e, m],
        # the peers' reduce layout over our reduce
        "moe_sum": lambda e, m: ours["moe_scatter_reduce", e, m],
        # the gate, then the decode pipeline
        "route_pipeline": lambda e, m: ours["moe_route", e, m] + ours["decode_pipeline", e, m],
        "route_pipeline_grouped": lambda e, m: ours["moe_route_grouped", e, m]
        + ours["decode_pipeline", e, m],
    }
    n = 0
    for r in rows:
        if r["op"] in fused:
            parts = fused[r["op"]](r["expert"], r["tokens"])
            # the CSV rounds to 4 significant digits
            assert float(r["parts_us"]) == pytest.approx(parts, rel=1e-3)
            assert float(r["fused_over_parts"]) == pytest.approx(
                ours[r["op"], r["expert"], r["tokens"]] / parts, rel=2e-3
            )
            n += 1
        else:
            assert r["fused_over_parts"] == ""
    assert n == len(fused) * len(cases.QUICK_SHAPES) * len(cases.QUICK_TOKENS_CPU)


def test_perf_tables_from_two_csv_files(tmp_path):
    """benchmarks/perf_tables.py: E x M tables of µs and of each fused op over its parts, the
    parts taken from either file (expected ratios worked out by hand)."""
    import perf_tables

    head = "op,expert,model_dim,inter,topk,tokens,block_m,ours_us\n"
    (tmp_path / "a.csv").write_text(
        head
        + "moe_sort,257,7168,256,9,1,32,2.0\n"
        + "mxfp4_quant,257,7168,256,9,1,32,1.0\n"
        + "moe_sort_quant,257,7168,256,9,1,32,3.0\n"
        + "moe_sort_scales,257,7168,256,9,1,32,2.0\n"
        + "decode_pipeline,257,7168,256,9,1,32,4.0\n"
        + "moe_sort,257,7168,256,9,2,32,9.0\n"
    )
    (tmp_path / "b.csv").write_text(
        head
        + "mxfp8_quant,257,7168,256,9,1,32,4.0\n"
        + "moe_sort_quant_fp8,257,7168,256,9,1,32,5.0\n"
        + "moe_sort,257,7168,256,9,2,32,2.5\n"  # the later file wins
    )
    times = perf_tables.load([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert times[("moe_sort", 257, 2)] == 2.5
    md = perf_tables.tables(times, None)
    assert "**moe_sort** (µs)\n\n| E \\ M | 1 | 2 |\n|---|---|---|\n| 257 | 2.00 | 2.50 |" in md
    # moe_sort_quant: 3 / max(2, 1); the fp8 op: 5 / max(2, 4) across the files; the
    # pipeline: 4 / (3 + 2)
    assert "**moe_sort_quant / max(moe_sort, mxfp4_quant)**" in md
    assert "| 257 | 1.50 |" in md and "| 257 | 1.25 |" in md and "| 257 | 0.80 |" in md
    only = perf_tables.tables(times, ["mxfp4_quant"])
    assert only.startswith("**mxfp4_quant** (µs)") and "moe_sort" not in only
    with pytest.raises(SystemExit) as e:
        perf_tables.main([str(tmp_path / "missing.csv")])
    assert e.value.code == 2


def test_perf_md_tables_are_current():
    """docs/perf.md's kernel-time tables are what each perf_tables.py command it names prints
    for the CSV it names (the tables come from the data, not from hand edits)."""
    import re

    import perf_tables

    root = BENCH.parent
    doc = (root / "docs" / "perf.md").read_text()
    found = re.findall(
        r"`python benchmarks/perf_tables\.py (docs/bench/\S+\.csv) --ops ([^`]+)`", doc
    )
    assert found, "docs/perf.md names no perf_tables.py command"
    for path, ops in found:
        csv_path, ops = root / path, ops.split()
        assert csv_path.is_file(), csv_path
        md = perf_tables.tables(perf_tables.load([csv_path]), ops)
        assert md.count("**") >= 2 * len(ops)
        assert md in doc, path
