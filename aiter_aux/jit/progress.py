"""Progress of a build, and the per-translation-unit times ninja records.

:class:`Reporter` is the ``progress(done, total, what)`` callback that
:func:`aiter_aux.jit.build.build_module` calls for each of ninja's ``[n/N] CXX ...`` lines:

* on a TTY it redraws one line: ``[12/94] 13%  21.4 s  CXX src/inst_moe_sort_e257_k9.cpp``;
* elsewhere (CI logs) it prints plain lines, one each time another ~10% is done or every
  few seconds, whichever comes first, and always the last one;
* :meth:`Reporter.finish` prints the total and the slowest translation units of the build.

The times come from ``.ninja_log`` in the build directory (:func:`read_ninja_log`): one
tab-separated line per output, ``start_ms end_ms mtime output command_hash``, appended by
each ninja run (v5 to v7 formats).  This build's outputs are those whose recorded mtime is
not older than the build's start: :meth:`Reporter.begin` marks it (call it right before
the build; the clock otherwise starts at the first progress line, after ninja has already
finished its first outputs).

:func:`first_build_note` is the one line a first op call that must compile prints first:
what it compiles, about how long that takes here (:data:`COMPILE_CPU_S` and the cores) and
how to avoid it.  Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

#: Compiler CPU seconds (user + sys) of the module of no shape (lookup, module_common, the
#: binding, which includes torch's headers, and on the CPU the kernels TUs) and of one
#: instance, by backend: the estimate of :func:`first_build_note` (CPU time, unlike wall
#: time, hardly depends on the machine's load).  cpu: g++ 12 on x86-64, the binding (-O1)
#: ~3.3 s, the kernels TUs (-O3) ~2.5 s, an instance (a call of its op's kernel) and its
#: library's link ~0.1 s.  ``autograd``: csrc/autograd/written_versions.cpp, all torch's full C++
#: headers, built alongside the module (:mod:`.written_versions`): g++ 12 -O1 ~6.5 s.  The
#: GPU backends are not measured: their note gives no time.
COMPILE_CPU_S = {"cpu": {"module": 6.0, "instance": 0.2, "autograd": 6.5}}


def module_units(backend: str) -> tuple[str, ...]:
    """The TUs of the module of no shape (:func:`codegen.instances.module_units`)."""
    from .paths import codegen_module

    return codegen_module("instances").module_units(backend)


NINJA_LOG = ".ninja_log"
MTIME_SLACK_NS = 50_000_000  # file mtimes use a coarse clock that may lag time.time_ns()


@dataclass(frozen=True)
class Timing:
    """One ninja output (``obj/inst_<key>.o``, the module) and its build time."""

    output: str
    seconds: float

    @property
    def name(self) -> str:
        """A short name: the instance key, ``lookup``, ``module_common`` or the file name."""
        stem = Path(self.output).name
        stem = stem[: -len(".o")] if stem.endswith(".o") else stem
        return stem[len("inst_") :] if stem.startswith("inst_") else stem


def read_ninja_log(directory: Path, since_ns: int | None = None) -> list[Timing]:
    """The outputs logged in ``directory/.ninja_log``, slowest first (the last entry of an
    output wins); with ``since_ns`` only those whose recorded mtime (ns since the epoch; v5
    logs of old ninjas store seconds) is at or after it, i.e. the outputs of a build that
    started then.  A missing or unreadable log gives ``[]``."""
    try:
        text = (Path(directory) / NINJA_LOG).read_text(errors="replace")
    except OSError:
        return []
    latest: dict[str, tuple[float, int]] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if line.startswith("#") or len(parts) < 4:
            continue
        try:
            start, end, mtime = int(parts[0]), int(parts[1]), int(parts[2])
        except ValueError:
            continue
        latest[parts[3]] = (
            max(0, end - start) / 1000.0,
            mtime * 10**9 if mtime < 10**12 else mtime,
        )
    return sorted(
        (Timing(out, secs) for out, (secs, mtime) in latest.items()
         if since_ns is None or mtime >= since_ns),
        key=lambda t: (-t.seconds, t.output),
    )  # fmt: skip


def format_slowest(timings: list[Timing], n: int = 5) -> str:
    """``"moe_sort_e257_k9 2.1 s, lookup 1.9 s, ..."`` for the ``n`` slowest compiles (under
    0.1 s in ms: ``"lookup 40 ms"``)."""
    tus = [t for t in timings if t.output.endswith(".o")] or timings
    return ", ".join(
        f"{t.name} {t.seconds:.1f} s" if t.seconds >= 0.1 else f"{t.name} {t.seconds * 1e3:.0f} ms"
        for t in tus[:n]
    )


class Reporter:
    """``progress(done, total, what)`` callback drawing build progress on ``stream``.

    Args:
        stream: where to write (default ``sys.stderr``).
        tty: force TTY (one updating line) or plain-line mode; default ``stream.isatty()``.
        step: in plain mode, print each time another ``step`` fraction is done ...
        interval_s: ... or when ``interval_s`` seconds passed since the last line.
        prefix: first word of every line.

    The clock starts at :meth:`begin` (else when the reporter is made, after :meth:`finish`,
    or when ``done`` goes backwards: a new build).  Thread-safe.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        step: float = 0.1,
        interval_s: float = 5.0,
        prefix: str = "aiter_aux:",
    ):
        self.stream = stream
        self._tty = tty
        self.step = step
        self.interval_s = interval_s
        self.prefix = prefix
        self._lock = threading.Lock()
        self._reset(0)

    def begin(self) -> None:
        """Mark the start of a build: :meth:`finish` reports the outputs made after it."""
        with self._lock:
            self._reset(0)

    def _reset(self, total: int) -> None:
        self.start = time.monotonic()
        self.start_ns = time.time_ns()
        self.total, self.done = total, 0
        self._printed_at, self._printed_step, self._open_line = self.start, -1, False

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    @property
    def tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        try:
            return self.out.isatty()
        except (AttributeError, ValueError):
            return False

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, done: int, total: int, what: str) -> None:
        with self._lock:
            if done < self.done:  # a new build without finish(): restart the clock
                self._reset(total)
            self.total, self.done = total, done
            pct = 100 * done // total if total else 100
            text = f"[{done}/{total}] {pct:3d}% {self.elapsed():6.1f} s  {what}"
            if self.tty:
                width = shutil.get_terminal_size((100, 20)).columns
                line = f"{self.prefix} {text}"[: max(20, width - 1)]
                self.out.write(f"\r\033[K{line}")
                self._open_line = done < total
                if done >= total:
                    self.out.write("\n")
                self.out.flush()
                return
            now = time.monotonic()
            step_no = int(done / max(total, 1) / self.step) if self.step > 0 else 0
            if (
                done >= total
                or step_no > self._printed_step
                or now - self._printed_at >= self.interval_s
            ):
                self._printed_step, self._printed_at = step_no, now
                self.out.write(f"{self.prefix} {text}\n")
                self.out.flush()

    def finish(self, result=None, n: int = 5) -> None:
        """End the progress display; with a ``BuildResult`` (``units``, ``compiled``,
        ``wall_s``, ``build_dir``) print the translation units compiled (the count the
        progress lines and the first-call note use; ``compiled`` of them instances), the
        wall time and the ``n`` slowest TUs (from the build directory's ``.ninja_log``)."""
        with self._lock:
            if self._open_line:
                self.out.write("\n")
                self._open_line = False
            units = getattr(result, "units", 0) if result is not None else 0
            if units:
                since = self.start_ns - MTIME_SLACK_NS
                slow = format_slowest(read_ninja_log(result.build_dir, since), n)
                self.out.write(
                    f"{self.prefix} compiled {units} translation unit(s) ({result.compiled} "
                    f"instance(s)) in {result.wall_s:.1f} s"
                    + (f"; slowest: {slow}" if slow else "")
                    + "\n"
                )
            self.out.flush()
            self._reset(0)


_DEFAULT: Reporter | None = None


def default_reporter() -> Reporter:
    """The process-wide reporter on stderr (used by ``aiter-aux build``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Reporter()
    return _DEFAULT


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{max(1, round(seconds))} s"
    if seconds < 90:
        return f"{max(5, round(seconds / 5) * 5):.0f} s"
    return f"{seconds / 60:.0f} min"


def first_build_note(
    backend: str,
    directory: Path,
    jobs: int | None = None,
    autograd: Path | None = None,
    autograd_after: Path | None = None,
) -> str:
    """The line a first op call that must compile says first: it compiles the module of no
    shape (the binding; :func:`module_units`) into ``directory`` (and, given ``autograd``,
    the ops' autograd kernel alongside, into that directory; given ``autograd_after``, after
    the module, as under ``MAX_JOBS=1``), then each instance as it is first called; about
    how long each takes with this machine's cores and its load (the estimate is compiler CPU
    time, :data:`COMPILE_CPU_S`, stretched by the share of a core a busy machine leaves;
    ``jobs``: ``MAX_JOBS``, if set), and how to avoid the waits."""
    obj = Path(directory) / "obj"
    units = module_units(backend)
    n = len(units)
    todo = sum(not (obj / f"{name}.o").exists() for name in units)
    what = f"{todo} of {n} translation units"
    if todo == 0:  # every object exists: the sources changed since they were built
        todo, what = n, f"up to {n} translation units: the sources changed since the last build"
    machine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    machine = max(1, machine or 1)
    cores = min(machine, jobs or machine)
    each = ""
    if backend in COMPILE_CPU_S:
        cost = COMPILE_CPU_S[backend]
        # The binding dominates: one core's work, of which this process gets about
        # cores / (load + 1) of a core when the machine is busy.
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        slower = max(1.0, (load + 1) / machine)
        seconds = cost["module"] * todo / n
        if autograd is not None:  # on a second core, as long as the binding on one
            seconds = max(seconds, cost["autograd"], (seconds + cost["autograd"]) / cores)
        elif autograd_after is not None:  # one compile at a time
            seconds += cost["autograd"]
        busy = f" at load {load:.1f}" if slower > 1 else ""
        what += f", about {_duration(seconds * slower)} on {cores} core{'s' * (cores > 1)}{busy}"
        per = cost["instance"] * slower
        each = " (under a second each)" if per < 1 else f" (about {_duration(per)} each)"
    return (
        f"the first {backend} op call of this process compiles the binding"
        f"{' and the kernels' if backend == 'cpu' else ''} ({what}) into "
        f"{directory}"
        + (f" and, alongside, the ops' autograd kernel into {autograd}" if autograd else "")
        + (f", then the ops' autograd kernel into {autograd_after}" if autograd_after else "")
        + f", then each instance as it is first called{each}; to skip these waits, "
        "run `aiter-aux build` ahead of time or install the prebuilt wheel "
        "(built with AITER_AUX_PREBUILD=1)"
    )
