"""The aux ops: ``torch.ops.aiter_aux.<op>`` / ``<op>_out`` and their typed Python wrappers.

Importing this package (or :mod:`aiter_aux`) defines the torch ops; the first call on a
backend loads that backend's compiled module ``module_moe_mxfp4_aux`` (building it if
needed), whose C++ binding (torch's stable ABI) registers the kernels.  For every op of the
op table (``codegen/ops.py``) there are two torch ops and two Python functions:

* ``<op>(inputs, *, options)`` allocates and returns its outputs;
* ``<op>_out(inputs, outputs, *, options)`` writes preallocated buffers (the torch op
  returns nothing, the Python function returns the buffers); it neither allocates nor
  synchronises, so it can be captured in a CUDA graph (call it once before capture: the
  first call on a backend may load or build the module).

The Python functions take the options by keyword only; the torch ops take them by position
too (their schemas' order), which is how the functions pass options that are not all
defaults: torch parses a keyword argument for about 0.4 us, a positional one for a fraction
of that.

Same API and same bytes as :mod:`aiter_aux.reference` (the spec; docs/ops.md).  Errors:
``TypeError`` / ``ValueError`` (bad input, raised before any kernel runs, with the
reference's message), :class:`UnsupportedShapeError` (a ``ValueError``: the catalog has no
instance for these parameters and none can be built), :class:`JitDisabledError` (a
``RuntimeError``: ``AITER_AUX_DISABLE_JIT=1`` and no module in the cache serves the backend),
``aiter_aux.jit.build.BuildError`` (the module failed to compile), ``RuntimeError`` (the
module reported an error, or an ``out=`` buffer requires grad under grad mode).  The ops are
not differentiable: outputs never require grad.  Every written tensor's version is bumped,
as by torch's in-place ops, so autograd refuses a backward over values an op overwrote
("modified by an inplace operation").  Tensors on the ``meta`` device (all of them) run the
fake implementation: shapes only.  ``torch.compile(fullgraph=True, dynamic=True)`` traces
them without graph breaks.

The wrappers are generated from the op table into :mod:`._ops` (docs/api.md lists them).
"""

from __future__ import annotations

from ..jit.paths import JitDisabledError
from ..types import MoeSortOutput
from ..validation import moe_sort_capacity
from . import _ops
from ._library import UnsupportedShapeError
from ._ops import *  # noqa: F403 (the generated wrappers, _ops.__all__)

__all__ = [
    "JitDisabledError",
    "MoeSortOutput",
    "UnsupportedShapeError",
    "moe_sort_capacity",
    *_ops.__all__,
]
