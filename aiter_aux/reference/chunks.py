"""Row chunking of the reference loops: bounds temporary memory on big inputs.

:data:`CHUNK_ELEMS` is read at call time, so assigning
``aiter_aux.reference.chunks.CHUNK_ELEMS`` changes the chunking of later calls (the
``torch.compile`` peer of ``benchmarks/bench_aux.py`` raises it to disable the row loop).
The chunk size never changes the results, only how many rows each step processes.
"""

from __future__ import annotations

#: Process about this many elements per chunk.
CHUNK_ELEMS = 1 << 22


def rows_per_chunk(row_elems: int) -> int:
    """Rows per chunk for rows of ``row_elems`` elements: ``max(1, CHUNK_ELEMS // row_elems)``."""
    return max(1, CHUNK_ELEMS // row_elems)
