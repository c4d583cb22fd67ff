"""The stages of ``benchmarks/bench_aux.py``, one module per job.

* ``common``  -- repository root on ``sys.path``, the aiter_aux imports, ``log``;
* ``cases``   -- the cases: shapes, token counts, ops, sizes, bytes moved, inputs and the
  :class:`~auxbench.cases.OpSpec` of each op (how to run ours and the reference, and compare);
* ``timing``  -- :class:`~auxbench.timing.Timer` (CUDA-graph replay, events, wall clock), the
  rotated buffer sets, the copy bandwidth;
* ``peers``   -- :class:`~auxbench.peers.CompiledPeer` (``torch.compile`` of the reference);
* ``measure`` -- one op of one case: ours, the eager and the compiled peer, the check;
* ``report``  -- :class:`~auxbench.report.Row`, the table, the CSV;
* ``goals``   -- the goals of ``benchmarks/goals.json`` checked against the rows;
* ``floors``  -- the prefill bandwidth-floor table (``--floors``);
* ``plot``    -- the optional matplotlib figure.

``bench_aux.py`` is the command line on top of them.
"""
