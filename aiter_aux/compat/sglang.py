"""SGLang's MoE auxiliary ops on aiter-aux's ops: switch by changing an import.

::

    # from sgl_kernel import moe_sum_reduce
    from aiter_aux.compat.sglang import moe_sum_reduce

Same names, signatures, outputs and meaning as SGLang's (docs/compat.md names the versions
read).  Importing this module builds and loads nothing; the first call loads (or builds)
the compiled module.
"""

from __future__ import annotations

from ._sums import moe_sum_reduce

__all__ = ["moe_sum_reduce"]
