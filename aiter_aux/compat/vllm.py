"""vLLM's MoE auxiliary ops on aiter-aux's ops: switch by changing an import.

::

    # from vllm._custom_ops import moe_sum
    from aiter_aux.compat.vllm import moe_sum

Same names, signatures, outputs and meaning as vLLM's (docs/compat.md names the versions
read).  Importing this module builds and loads nothing; the first call loads (or builds)
the compiled module.
"""

from __future__ import annotations

from ._sums import moe_sum

__all__ = ["moe_sum"]
