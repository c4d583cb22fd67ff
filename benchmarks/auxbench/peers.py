"""The ``torch.compile`` peer of the reference ops (the eager peer is the reference itself,
called through :class:`~auxbench.cases.OpSpec`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .common import ref


class CompiledPeer:
    """``torch.compile`` (Inductor, dynamic=True) of the reference ``_out`` functions, one
    callable per function shared across sizes and shapes.  The reference's row chunking (a
    Python loop that Dynamo would unroll, recompiling per token count) is disabled while a
    compiled callable runs.  Cumulative compile time is bounded by ``budget_s``: once spent,
    a call that would (re)compile raises and the case is recorded as n/a."""

    FUNCS = (
        "moe_sort_out",
        "mxfp4_quant_out",
        "moe_sort_quant_out",
        "mxfp8_quant_out",
        "moe_sort_scales_out",
        "moe_scatter_reduce_out",
        "moe_scatter_reduce_q_out",
    )

    def __init__(self, enabled: bool, reason: str, budget_s: float):
        self.enabled = enabled
        self.reason = reason
        self.budget_s = budget_s
        self.compile_s = 0.0
        self.frozen = False
        self.broken: dict[str, str] = {}  # function -> reason
        self.fns: dict[str, Callable] = {}
        if not enabled:
            return
        import logging

        import torch._dynamo as dynamo

        try:  # the reference's graph breaks are expected: do not print each one
            torch._logging.set_logs(dynamo=logging.ERROR)
        except Exception:  # noqa: BLE001
            logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
        cfg = dynamo.config
        for name, value in (
            ("recompile_limit", 64),
            ("cache_size_limit", 64),
            ("accumulated_recompile_limit", 4096),
            ("accumulated_cache_size_limit", 4096),
            ("fail_on_recompile_limit_hit", True),
            ("fail_on_cache_limit_hit", True),
        ):
            if hasattr(cfg, name):
                try:
                    setattr(cfg, name, value)
                except Exception:  # noqa: BLE001 - renamed/aliased options
                    pass
        for name in self.FUNCS:
            self.fns[name] = torch.compile(getattr(ref, name), dynamic=True)

    def _freeze(self) -> None:
        """No more compilation: a call that needs one raises."""
        if self.frozen:
            return
        self.frozen = True
        try:
            torch.compiler.set_stance("fail_on_recompile")
        except Exception:  # noqa: BLE001 - older torch
            import torch._dynamo as dynamo

            dynamo.config.error_on_recompile = True

    def _graphs(self) -> int:
        try:
            import torch._dynamo.utils as du

            return int(du.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001 - internal counter moved: rely on the wall time
            return 0

    def call(self, name: str, *args, **kwargs):
        if name in self.broken:
            raise RuntimeError(self.broken[name])
        if self.compile_s >= self.budget_s:
            self._freeze()
        saved = ref.chunks.CHUNK_ELEMS
        ref.chunks.CHUNK_ELEMS = 1 << 62
        before = self._graphs()
        t0 = time.perf_counter()
        try:
            return self.fns[name](*args, **kwargs)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
            if self.frozen:
                msg = f"needs a (re)compile; the compile budget ({self.budget_s:.0f} s) is spent"
            else:
                self.broken[name] = f"failed earlier: {msg}"
            raise RuntimeError(msg) from exc
        finally:
            ref.chunks.CHUNK_ELEMS = saved
            took = time.perf_counter() - t0
            if self._graphs() != before or took > 5.0:  # a (re)compile happened
                self.compile_s += took
