"""ctypes mirror of ``csrc/kernels/mxfp4_moe/mxfp4_moe_aux_abi.h``.

The module reports its ABI version and ``sizeof`` of every args struct; :func:`check`
compares them with these definitions when the module is loaded, so a header/mirror
mismatch fails loudly instead of passing misread arguments.
"""

from __future__ import annotations

import ctypes as C

ABI_VERSION = 1

OP_MOE_SORT = 1
OP_MXFP4_QUANT = 2
OP_MOE_SORT_QUANT = 3
OP_MOE_SORT_SCALES = 4
OP_MOE_SCATTER_REDUCE = 5
OP_MOE_SCATTER_REDUCE_Q = 6

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_LAUNCH = 2

_p = C.c_void_p


class SortArgs(C.Structure):
    _fields_ = [
        ("topk_ids", _p),
        ("topk_weights", _p),
        ("num_tokens", C.c_int64),
        ("num_experts", C.c_int32),
        ("topk", C.c_int32),
        ("block_m", C.c_int32),
        ("reserved0", C.c_int32),
        ("max_rows", C.c_int64),
        ("sorted_token_ids", _p),
        ("sorted_weights", _p),
        ("m_indices", _p),
        ("sorted_expert_ids", _p),
        ("num_valid_ids", _p),
        ("reverse_sorted", _p),
        ("zero_buf", _p),
        ("zero_numel", C.c_int64),
    ]


class QuantArgs(C.Structure):
    _fields_ = [
        ("x", _p),
        ("num_tokens", C.c_int64),
        ("model_dim", C.c_int32),
        ("reserved0", C.c_int32),
        ("a_q", _p),
        ("a_scale", _p),
    ]


class SortQuantArgs(C.Structure):
    _fields_ = [("sort", SortArgs), ("quant", QuantArgs)]


class SortScalesArgs(C.Structure):
    _fields_ = [
        ("a_scale", _p),
        ("num_tokens", C.c_int64),
        ("model_dim", C.c_int32),
        ("block_m", C.c_int32),
        ("sorted_token_ids", _p),
        ("num_valid_ids", _p),
        ("max_rows", C.c_int64),
        ("sorted_scales", _p),
    ]


class ScatterArgs(C.Structure):
    _fields_ = [
        ("expert_out", _p),
        ("expert_out_q", _p),
        ("expert_out_scale", _p),
        ("num_rows", C.c_int64),
        ("reverse_sorted", _p),
        ("sorted_weights", _p),
        ("num_tokens", C.c_int64),
        ("model_dim", C.c_int32),
        ("topk", C.c_int32),
        ("out", _p),
    ]


STRUCTS = {
    OP_MOE_SORT: SortArgs,
    OP_MXFP4_QUANT: QuantArgs,
    OP_MOE_SORT_QUANT: SortQuantArgs,
    OP_MOE_SORT_SCALES: SortScalesArgs,
    OP_MOE_SCATTER_REDUCE: ScatterArgs,
    OP_MOE_SCATTER_REDUCE_Q: ScatterArgs,
}

InstanceFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)


class Instance(C.Structure):
    _fields_ = [("key", C.c_char_p), ("op", C.c_int32), ("fn", InstanceFn)]


def declare(lib: C.CDLL) -> None:
    """Set the signatures of the module's exported functions."""
    lib.aiter_aux_abi_version.restype = C.c_int
    lib.aiter_aux_backend.restype = C.c_char_p
    lib.aiter_aux_num_instances.restype = C.c_int
    lib.aiter_aux_instance.restype = C.POINTER(Instance)
    lib.aiter_aux_instance.argtypes = [C.c_int]
    lib.aiter_aux_find.restype = C.POINTER(Instance)
    lib.aiter_aux_find.argtypes = [C.c_char_p]
    lib.aiter_aux_struct_size.restype = C.c_int64
    lib.aiter_aux_struct_size.argtypes = [C.c_int]
    lib.aiter_aux_last_error.restype = C.c_char_p


def check(lib: C.CDLL, path) -> None:
    """Raise RuntimeError when the module's ABI differs from this mirror."""
    version = lib.aiter_aux_abi_version()
    if version != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI version {version}, expected {ABI_VERSION}; rebuild it")
    for op, struct in STRUCTS.items():
        size = lib.aiter_aux_struct_size(op)
        if size != C.sizeof(struct):
            raise RuntimeError(
                f"{path}: args struct of op {op} is {size} bytes in C but "
                f"{C.sizeof(struct)} in aiter_aux/jit/abi.py; the two definitions disagree"
            )
