"""What a build of given shapes holds, derived from the op table (``codegen/ops.py``) and
the instance rules (``codegen/instances.py``): its keys, its translation units and its ninja
edges.  Tests that count instances, keys or edges use these, so adding an op to the table
needs no edit of them."""

from __future__ import annotations

from aiter_aux.jit.paths import codegen_module

_instances = codegen_module("instances")

N_OPS = len(_instances.INSTANCE_OPS)  # one instance per op with kernels for each shape
#: The translation units of a CPU build besides one per instance (build.ninja's layout): the
#: lookup, module_common, the binding and the CPU kernels TUs.
OTHER_TUS = _instances.module_units("cpu")
N_OTHER_EDGES = len(OTHER_TUS) + 1  # those and the link


def keys_of(*shapes) -> set[str]:
    """The instance keys of ``shapes`` (each ``(expert, model_dim, inter, topk)``)."""
    return {inst.key for inst in _instances.enumerate_instances(tuple(s) for s in shapes)}


def n_tus(n_instances: int) -> int:
    """The translation units of a build of ``n_instances`` instances."""
    return n_instances + len(OTHER_TUS)


def n_edges(n_instances: int) -> int:
    """The ninja edges of a build of ``n_instances`` instances (every TU and the link)."""
    return n_instances + N_OTHER_EDGES
