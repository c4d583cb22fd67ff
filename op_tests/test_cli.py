"""The ``aiter-aux`` command line: --version and help, one-line user errors,
``clean``'s confirmation and ``--backend``, ``list``'s table, and ``run``'s table with its
CSV/JSON output.  Builds use a one-shape copy of the sources
(``AITER_AUX_SOURCE_DIR``) and a temporary cache."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import aiter_aux
from aiter_aux import cli

ROOT = Path(__file__).resolve().parents[1]
SHAPE = "(256, 3072, 256, 8),  # MiniMax-M2 TP8"
HAS_GPU = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory) -> Path:
    """codegen/, templates/, csrc/ with SHAPES cut to one shape."""
    tree = tmp_path_factory.mktemp("tree")
    for sub in ("codegen", "templates", "csrc"):
        shutil.copytree(ROOT / sub, tree / sub, ignore=shutil.ignore_patterns("__pycache__"))
    gen = tree / "codegen" / "catalog.py"
    text = gen.read_text()
    start = text.index("SHAPES = [\n")
    end = text.index("\n]\n", start)
    gen.write_text(text[:start] + f"SHAPES = [\n    {SHAPE}" + text[end:])
    return tree


def aiter_aux_cli(*args: str, tree: Path | None = None, cache: Path | None = None,
                  stdin=subprocess.DEVNULL, **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("AITER_AUX_") and k != "MAX_JOBS"}  # fmt: skip
    if tree is not None:
        base["AITER_AUX_SOURCE_DIR"] = str(tree)
    if cache is not None:
        base["AITER_AUX_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "aiter_aux.cli", *args], capture_output=True,
                          text=True, stdin=stdin, env={**base, **env}, timeout=900)  # fmt: skip


def one_line_error(p: subprocess.CompletedProcess, command: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"aiter-aux {command}: error: "), lines
    return lines[0]


# ------------------------------------------------------------------------ version, help
def test_version_is_the_package_version(tmp_path):
    p = aiter_aux_cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"aiter-aux {aiter_aux.__version__}"
    # without the JIT's sources: --version still answers, a command says why in one line
    p = aiter_aux_cli("--version", tree=tmp_path / "missing")
    assert p.returncode == 0 and p.stdout.strip() == f"aiter-aux {aiter_aux.__version__}"
    line = one_line_error(aiter_aux_cli("list", tree=tmp_path / "missing"), "list")
    assert f"EnvError: AITER_AUX_SOURCE_DIR='{tmp_path / 'missing'}'" in line, line


def test_every_subcommand_and_option_has_help():
    parser = cli.build_parser()
    text = parser.format_help()
    assert "examples:" in text and "aiter-aux run --shape" in text
    (sub,) = [a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction)]
    assert set(sub.choices) == {"build", "list", "run", "clean", "doctor", "add-shape",
                                "remove-shape"}  # fmt: skip
    for name, p in sub.choices.items():
        assert p.description, name
        text += p.format_help()
        for action in p._actions:
            assert action.help and action.help.strip(), (name, action.option_strings)
    assert "``" not in text and ":func:" not in text  # no RST markup shown literally


# ------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize("command", ["build", "list", "clean", "doctor"])
def test_an_unknown_argument_names_its_subcommand(command, tmp_path):
    """argparse reports extra arguments on the program's parser; the line names the
    subcommand they were given to and its --help."""
    line = one_line_error(aiter_aux_cli(command, "extra", cache=tmp_path), command)
    assert line.endswith(f"unrecognized arguments: extra (see aiter-aux {command} --help)"), line
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize(
    "args, fragment",
    [(["--tokens", "-5"], "-5 is outside [0, 16777215]"),
     (["--tokens", ""], "empty"),
     (["--tokens", "1,,2"], "item 2 of '1,,2' is empty"),
     (["--tokens", "1,x"], "'x' is not an integer"),
     (["--device", "foo"], "--device 'foo' is not a device"),
     (["--device", "meta"], "not on meta"),
     pytest.param(["--device", "cuda"], "sees no GPU",
                  marks=pytest.mark.skipif(HAS_GPU, reason="a GPU is visible")),
     (["--repeat", "0"], "--repeat 0: must be at least 1"),
     (["--csv", "/nonexistent/run.csv"], "its directory does not exist"),
     (["--csv", "/tmp"], "--csv /tmp: is a directory"),
     (["--json", "/proc/x.json"], "--json /proc/x.json: not writable"),
     (["--shape", "8,300,256,2"], "cannot be served: model_dim must be a positive multiple"),
     (["--seed", str(2**70)], f"argument --seed: {2**70} is outside [0, {2**64 - 1}]"),
     (["--routed-scaling", "nan"], "argument --routed-scaling: 'nan' is not a finite number"),
     (["--routed-scaling", "inf"], "argument --routed-scaling: 'inf' is not a finite number"),
     (["--routed-scaling=-Infinity"], "'-Infinity' is not a finite number"),
     (["--routed-scaling", "1e999"], "'1e999' is not a finite number")],
)  # fmt: skip
def test_run_user_errors_are_one_line(args, fragment, tmp_path):
    if "--shape" not in args:
        args = ["--shape", "256,3072,256,8", *args]
    line = one_line_error(aiter_aux_cli("run", *args, cache=tmp_path), "run")
    assert fragment in line, line


@pytest.mark.parametrize(
    "env, fragment",
    [({"MAX_JOBS": "abc"}, "EnvError: MAX_JOBS='abc': expected a positive integer"),
     ({"MAX_JOBS": "-1"}, "EnvError: MAX_JOBS='-1': expected a positive integer"),
     ({"AITER_AUX_LOCK_TIMEOUT": "abc"}, "EnvError: AITER_AUX_LOCK_TIMEOUT='abc'"),
     ({"AITER_AUX_SOURCE_DIR": "/nonexistent"}, "EnvError: AITER_AUX_SOURCE_DIR='/nonexistent': "
      "expected an existing directory holding codegen/catalog.py"),
     pytest.param({"AITER_AUX_BACKEND": "cuda"}, "ToolchainError",
                  marks=pytest.mark.skipif(HAS_GPU, reason="a GPU is visible"))],
)  # fmt: skip
def test_build_user_errors_are_one_line(env, fragment, small_tree, tmp_path):
    line = one_line_error(aiter_aux_cli("build", tree=small_tree, cache=tmp_path, **env), "build")
    assert fragment in line, line


@pytest.mark.parametrize("command", [["list"], ["remove-shape", "128,3072,512,4"]])
def test_a_bad_variable_is_refused_before_any_command_acts(command, small_tree, tmp_path):
    """Every variable is parsed first: a command that would not read MAX_JOBS (list), or
    would read it only after editing the catalog (remove-shape), refuses it up front."""
    before = {p: p.read_text() for p in small_tree.rglob("*.py")}
    p = aiter_aux_cli(*command, tree=small_tree, cache=tmp_path, MAX_JOBS="abc")
    assert "EnvError: MAX_JOBS='abc'" in one_line_error(p, command[0])
    assert {p: p.read_text() for p in small_tree.rglob("*.py")} == before


def test_verbose_before_or_after_the_command():
    parse = cli.build_parser().parse_args
    assert parse(["-v", "list"]).verbose and parse(["list", "-v"]).verbose
    assert not parse(["list"]).verbose and not parse(["doctor"]).verbose


def test_cache_safety_error_is_one_line_and_verbose_shows_the_traceback(small_tree, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(cache.stat().st_mode | stat.S_IWGRP | stat.S_IWOTH)
    line = one_line_error(aiter_aux_cli("build", tree=small_tree, cache=cache), "build")
    assert "CacheSafetyError" in line and "-v for a traceback" in line
    for extra, env in ((["-v"], {}), ([], {"AITER_AUX_VERBOSE": "1"})):
        for args in (["build", *extra], [*extra, "build"]):
            p = aiter_aux_cli(*args, tree=small_tree, cache=cache, **env)
            # the traceback, then the same last line and exit code as without -v
            assert p.returncode == 2 and "Traceback" in p.stderr, p.stderr
            assert p.stderr.splitlines()[-1].startswith("aiter-aux build: error: CacheSafetyError")


# ------------------------------------------------------------------------------ clean
def test_clean_asks_before_removing_everything_and_can_remove_one_backend(tmp_path):
    cache = tmp_path / "cache"
    for name in ("cpu-host-0", "cpu-host-1", "cuda-sm_90-2"):
        (cache / name).mkdir(parents=True)
    line = one_line_error(aiter_aux_cli("clean", cache=cache), "clean")  # stdin: not a tty
    assert "--yes" in line and cache.is_dir()
    p = aiter_aux_cli("clean", "--backend", "cpu", cache=cache)
    builds = sorted(x.name for x in cache.iterdir() if x.is_dir())  # (and the cache lock file)
    assert p.returncode == 0 and builds == ["cuda-sm_90-2"]
    p = aiter_aux_cli("clean", "--backend", "rocm", cache=cache)
    assert p.returncode == 0 and "no rocm build" in p.stdout
    p = aiter_aux_cli("clean", "--yes", cache=cache)
    assert p.returncode == 0 and not cache.exists() and str(cache) in p.stdout


# ------------------------------------------------------------------------------- list
def test_list_views_exclude_each_other():
    """--models and --cached are two views: asked together, one line and exit 2 (the first
    was printed and the second ignored)."""
    line = one_line_error(aiter_aux_cli("list", "--models", "--cached"), "list")
    assert "--cached" in line and "--models" in line


def test_list_fits_100_columns_and_names_models():
    p = aiter_aux_cli("list")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert any(ln.rstrip().endswith("Kimi-K2.5 TP4") for ln in lines)
    assert "initial catalog" not in p.stdout and "moe_sort_e385_k9" not in p.stdout
    wide = aiter_aux_cli("list", "--wide")
    assert wide.returncode == 0 and "moe_sort_e385_k9" in wide.stdout


def on_a_terminal(*args: str, columns: int = 160) -> str:
    """``aiter-aux ARGS``'s stdout with stdout a terminal (a pty ``columns`` wide)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_AUX_")
           and k not in ("MAX_JOBS", "COLUMNS", "LINES")}  # fmt: skip
    p = subprocess.Popen([sys.executable, "-m", "aiter_aux.cli", *args], stdout=slave,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=300) == 0
    return out.decode().replace("\r\n", "\n")


@pytest.mark.parametrize("models", [[], ["--models"]], ids=["list", "list --models"])
def test_list_rows_whole_with_wide_or_off_a_terminal(models):
    """On a terminal the rows fit 100 columns (cut with "..."); with --wide, or when stdout
    is not a terminal (a pipe, a file), every row is whole."""

    def rows(text: str) -> list[str]:  # less --wide's instance keys and list's last line
        return [ln for ln in text.splitlines()
                if not ln.startswith("        ") and "unique instances" not in ln]  # fmt: skip

    lines = {}
    for wide in ([], ["--wide"]):
        piped = aiter_aux_cli("list", *models, *wide)
        assert piped.returncode == 0, piped.stderr
        lines["piped", bool(wide)] = rows(piped.stdout)
        lines["tty", bool(wide)] = rows(on_a_terminal("list", *models, *wide))
    whole = lines["piped", False]
    assert not [ln for ln in whole if ln.endswith("...")], "a row cut off a terminal"
    assert lines["piped", True] == whole and lines["tty", True] == whole
    tty = lines["tty", False]
    assert max(map(len, tty)) <= 100 and len(tty) == len(whole)
    for cut, full in zip(tty, whole, strict=True):
        assert cut == full or (cut.endswith("...") and full.startswith(cut[:-3])), cut
    if models:  # DeepSeek-V3's layouts are longer than 100 columns: cut only on a terminal
        assert max(map(len, whole)) > 100 and any(ln.endswith("...") for ln in tty)


# -------------------------------------------------------------------------------- run
def test_run_serves_a_shape_the_catalog_lacks(small_tree, tmp_path):
    """A servable shape outside the catalog runs, its instances built on first use."""
    pytest.importorskip("torch")
    p = aiter_aux_cli("run", "--shape", "7,256,256,1", "--tokens", "1", "--repeat", "1",
                      tree=small_tree, cache=tmp_path / "cache")  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not in the catalog: its instances are built on first use" in p.stdout, p.stdout
    assert "all 8 outputs match the reference" in p.stdout, p.stdout  # the preamble too


def test_run_table_labels_spread_bytes_and_writes_csv_json(small_tree, tmp_path):
    pytest.importorskip("torch")
    out_csv, out_json = tmp_path / "run.csv", tmp_path / "run.json"
    p = aiter_aux_cli("run", "--shape", "256,3072,200,8", "--tokens", "1,33", "--repeat", "12",
                      "--seed", "3", "--csv", str(out_csv), "--json", str(out_json),
                      tree=small_tree, cache=tmp_path / "cache")  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "inter=200 -> 256" in out and "seed=3" in out
    assert "wall clock" in out and "load-sensitive" in out and "n calls per op: 12" in out
    header = next(ln for ln in out.splitlines() if "median us" in ln)
    for column in ("p10-p90 us", "bytes", "GB/s", "check"):
        assert column in header
    assert "tokens=1: all 8 outputs match" in out and "tokens=33: all 8 outputs match" in out
    # the routing: random logits through moe_route, with moe_route's defaults (no shipped
    # model config serves this shape), checked like every op
    assert "router: default (softmax, renormalize): no shipped model config serves" in out
    assert "route+sort_quant+sort_scales+scatter_q" in out
    assert max(len(ln) for ln in out.splitlines() if str(tmp_path) not in ln) <= 100
    assert f"wrote {out_csv}" in out and f"wrote {out_json}" in out
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 16 and {r["check"] for r in rows} == {"ok"}  # 8 ops x 2 token counts
    assert [r["op"] for r in rows][:2] == ["moe_route", "moe_sort"]
    assert {r["router"] for r in rows} == {"default (softmax, renormalize)"}
    assert {r["inter_rounded"] for r in rows} == {"256"} and {r["n"] for r in rows} == {"12"}
    assert all(float(r["p10_us"]) <= float(r["median_us"]) <= float(r["p90_us"]) for r in rows)
    data = json.loads(out_json.read_text())
    assert data["run"]["timer"] == "wall-clock" and len(data["rows"]) == 16
    assert all(r["bytes"] > 0 and r["gb_s"] > 0 for r in data["rows"])
    # a write that fails after the run (a full disk): one line naming the file
    p = aiter_aux_cli("run", "--shape", "256,3072,256,8", "--tokens", "1", "--repeat", "1",
                      "--json", "/dev/full", tree=small_tree, cache=tmp_path / "cache")  # fmt: skip
    line = one_line_error(p, "run")
    assert "OSError: [Errno 28] No space left on device: '/dev/full'" in line, line


def test_run_with_a_model_router(small_tree, tmp_path):
    pytest.importorskip("torch")
    p = aiter_aux_cli("run", "--shape", "256,3072,200,8", "--tokens", "0,5", "--repeat", "2",
                      "--router", "deepseek-v3", "--seed", "4", tree=small_tree,
                      cache=tmp_path / "cache")  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.replace("\n  ", " ")
    assert ("router: DeepSeek-V3 (sigmoid, renormalize, groups 4 of 8, correction bias, "
            "scaling 2.5): --router deepseek-v3; moe_route of random bf16 logits over 256 "
            "experts, top-8.") in out  # fmt: skip
    assert "tokens=0: all 8 outputs match" in out and "tokens=5: all 8 outputs match" in out
    line = one_line_error(aiter_aux_cli("run", "--shape", "256,3072,200,8", "--router",
                                        "DeepSeek-V4-Flash", tree=small_tree,
                                        cache=tmp_path / "cache"), "run")  # fmt: skip
    assert "sqrt(softplus(logit))" in line, line


def test_list_cached_refuses_a_cache_that_is_a_file(tmp_path):
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("")
    line = one_line_error(aiter_aux_cli("list", "--cached", cache=not_a_dir), "list")
    assert "is not a directory (AITER_AUX_CACHE_DIR)" in line, line


def test_cli_md_shows_the_main_job_as_it_is():
    """docs/cli.md's block under "The main job" lists scripts/main.sh's aiter-aux commands."""
    script = (ROOT / "scripts" / "main.sh").read_text()
    doc = (ROOT / "docs" / "cli.md").read_text().split("## The main job", 1)[1]
    block = doc.split("```bash\n", 1)[1].split("```", 1)[0]

    def commands(text):
        lines = (ln.split("#", 1)[0].split() for ln in text.splitlines())
        return [ln for ln in lines if ln[:1] == ["aiter-aux"]]

    assert commands(block) == commands(script)
