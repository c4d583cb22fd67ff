"""One op of one case: the eager reference (its output is the reference bytes), ours over
rotated buffer sets in one CUDA graph, the ``torch.compile`` peer, and the check."""

from __future__ import annotations

import time

from .cases import OpSpec, Sizes, clone_inputs, footprint
from .goals import same_copy_ops
from .peers import CompiledPeer
from .report import Row
from .timing import Timer, n_buffer_sets


def run_op(
    op: str,
    spec: OpSpec,
    s: Sizes,
    row: Row,
    timer: Timer,
    peer: CompiledPeer,
    l2_bytes: int,
    big: bool,
) -> None:
    """Time ours and the peers for one op of a case; fills ``row``."""
    # eager reference: its first output is the reference bytes
    want = spec.new_outputs()
    spec.eager(spec.inputs, want)
    timer.sync()
    est = timer.once_us(lambda: spec.eager(spec.inputs, want), busy_prefix=False)
    row.eager_us, _ = timer.peer_us(lambda: spec.eager(spec.inputs, want), est, 5 if big else 10)

    # ours: rotated buffer sets, one graph of back-to-back calls
    out0 = spec.new_outputs()
    set_bytes = footprint(spec.inputs, out0)
    n_sets = n_buffer_sets(timer, set_bytes, l2_bytes)
    sets = [(spec.inputs, out0)]
    for _ in range(n_sets - 1):
        sets.append((clone_inputs(spec.inputs), spec.new_outputs()))
    row.n_sets = n_sets
    calls = [(lambda i=i, o=o: spec.ours(i, o)) for i, o in sets]
    calls[0]()
    timer.sync()
    est = timer.once_us(calls[0])
    row.ours_us, row.timing = timer.ours_us(calls, est)
    timer.sync()
    row.check = "ok" if spec.same(out0, want) else "MISMATCH"
    del sets, calls

    # a copy kernel of the same bytes, timed the same way: what a plain kernel reaches here
    if op in same_copy_ops():
        row.copy_same_us = timer.same_bytes_copy_us(row.bytes, l2_bytes)

    # torch.compile peer
    if not peer.enabled:
        row.compiled_note = peer.reason
    elif spec.compiled is None:
        row.compiled_note = "n/a"
    else:
        comp_out = spec.new_outputs()
        try:
            t0 = time.perf_counter()
            spec.compiled(peer, spec.inputs, comp_out)
            timer.sync()
            first = time.perf_counter() - t0
            fn = lambda: spec.compiled(peer, spec.inputs, comp_out)  # noqa: E731
            est = timer.once_us(fn, busy_prefix=False)
            row.compiled_us, _ = timer.peer_us(fn, est, 5 if big else 10)
            if first > 1.0:
                row.notes.append(f"compile/first call {first:.1f}s")
            if not spec.same(comp_out, want):
                row.compiled_note = "compiled output differs from the reference"
        except RuntimeError as exc:
            timer.sync()
            row.compiled_note = f"n/a: {exc}"
        del comp_out
