"""The drop-ins of :mod:`aiter_aux.compat` under ``torch.compile(fullgraph=True)`` on CPU:
each traces without a graph break (as the native ops do) and its compiled form writes the
same bytes as its eager form.  The ``aot_eager`` backend runs the traced graph through
AOTAutograd's functionalization of the written buffers; the bytes come from the ops."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from aiter_aux import ops  # noqa: E402
from aiter_aux.compat import aiter as A  # noqa: E402
from aiter_aux.compat import sglang as S  # noqa: E402
from aiter_aux.compat import vllm as V  # noqa: E402
from aiter_aux.compat.sglang import srt as SRT  # noqa: E402
from aiter_aux.compat.vllm import custom_ops as CO  # noqa: E402

E, K, M, BS = 33, 8, 5, 16  # a catalog (num_experts, topk) of the align tests
I32 = torch.int32


@pytest.fixture(autouse=True)
def _module(cpu_module):
    return cpu_module


def _bytes(ts) -> list[bytes]:
    return [t.contiguous().view(torch.uint8).numpy().tobytes() for t in ts]


def _same_compiled(fn, make_args):
    """``fn(*args)`` (returning tensors) eager and compiled on fresh arguments: same bytes."""
    torch._dynamo.reset()
    eager = fn(*make_args())
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*make_args())
    assert _bytes(compiled) == _bytes(eager)


def _ids(seed: int = 0, ids_dtype=I32):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(ids_dtype)
    ids[0, 0] = -1
    return ids


def _sum_args():
    g = torch.Generator().manual_seed(1)
    return torch.randn(M, K, 64, generator=g).to(torch.bfloat16), torch.empty(
        M, 64, dtype=torch.bfloat16
    )


def test_sums():
    def vllm_sum(x, out, ids, emap):
        V.moe_sum(x, out, ids, emap)
        return (out.clone(),)

    def sglang_sums(x, out):
        S.moe_sum_reduce(x, out, 2.5)
        first = out.clone()
        S.moe_sum(x, out)
        return first, out.clone()

    emap = torch.arange(E, dtype=I32) - 1  # expert 0 not local
    _same_compiled(vllm_sum, lambda: (*_sum_args(), None, None))
    _same_compiled(vllm_sum, lambda: (*_sum_args(), _ids(), emap))
    _same_compiled(sglang_sums, _sum_args)


def test_aiter_quant():
    d = 3072

    def quant(x, q, scale, zero):
        A.mxfp4_moe_quant(x, q, scale, zero, 256, 8, d, 32)
        return q.clone(), scale.clone(), zero.clone()

    def args():
        x = torch.randn(M, d, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        q = torch.empty(M, d // 2, dtype=torch.uint8)
        return x, q, torch.empty(M, d // 32, dtype=torch.uint8), torch.ones(M, d).bfloat16()

    _same_compiled(quant, args)


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("with_map", [False, True])
def test_vllm_align(with_map, ignore):
    emap = torch.where(torch.arange(E) % 3 == 0, -1, torch.arange(E)).to(I32)

    def align(ids):
        return V.moe_align_block_size(ids, BS, E, emap if with_map else None,
                                      ignore_invalid_experts=ignore,
                                      return_scatter_idx=ignore or not with_map)  # fmt: skip

    _same_compiled(align, lambda: (_ids(),))
    _same_compiled(align, lambda: (_ids(3, torch.int64),))


@pytest.mark.parametrize("with_map", [False, True])
def test_vllm_custom_align(with_map):
    cap = M * K + E * (BS - 1)

    def align(ids, sorted_ids, expert_ids, total, scatter_idx):
        emap = torch.arange(E, dtype=I32).flip(0) if with_map else None
        CO.moe_align_block_size(ids, E, BS, sorted_ids, expert_ids, total, emap, scatter_idx)
        return sorted_ids.clone(), expert_ids.clone(), total.clone(), scatter_idx.clone()

    def args():
        return (_ids(), torch.full((cap,), -7, dtype=I32), torch.full((cap // BS + 2,), -7,
                dtype=I32), torch.empty(1, dtype=I32), torch.empty(M * K, dtype=I32))  # fmt: skip

    _same_compiled(align, args)


def _sglang_align(ignore: bool, ids):
    """SGLang's align as a function of its buffers (its outputs cloned), and a maker of its
    arguments: ``ids()`` and buffers of SGLang's size."""
    cap = M * K + (E + 1) * (BS - 1)

    def align(ids, sorted_ids, expert_ids, total):
        S.moe_align_block_size(ids, E + 1, BS, sorted_ids, expert_ids, total, None, False,
                               ignore)  # fmt: skip
        return sorted_ids.clone(), expert_ids.clone(), total.clone()

    def args():
        return (ids(), torch.empty(cap, dtype=I32), torch.empty(-(-cap // BS), dtype=I32),
                torch.empty(1, dtype=I32))  # fmt: skip

    return align, args


@pytest.mark.parametrize("ignore", [False, True])
def test_sglang_align(ignore):
    _same_compiled(*_sglang_align(ignore, _ids))
    _same_compiled(lambda ids: SRT.moe_align_block_size(ids, BS, E, ignore), lambda: (_ids(),))


def _raises_eager_and_compiled(fn, make_args, message: str):
    """``fn`` raises eagerly (ValueError) and compiled (the check traced into the graph:
    RuntimeError), both naming ``message``."""
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=message):
        fn(*make_args())
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match=message):
        compiled(*make_args())


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("bad", [E, -2])
def test_sglang_align_out_of_range_ids_raise_compiled_as_eager(ignore, bad):
    """SGLang reads out of bounds for an id outside [-1, E): the drop-in raises, compiled as
    eager (with ignore_invalid_expert a negative id is skipped: only >= E raises)."""

    def ids():
        t = _ids()
        t[2, 3] = bad
        return t

    align, args = _sglang_align(ignore, ids)
    if ignore and bad < 0:  # skipped, as SGLang skips it: compiled and eager agree
        _same_compiled(align, args)
        return
    rule = re.escape(f"< {E}" if ignore else f"in [-1, {E})")
    _raises_eager_and_compiled(align, args, f"topk_ids values must be {rule}")
    srt = lambda t: SRT.moe_align_block_size(t, BS, E, ignore)  # noqa: E731
    _raises_eager_and_compiled(srt, lambda: (ids(),), f"topk_ids values must be {rule}")


def test_vllm_align_map_out_of_range_raises_compiled_as_eager():
    """With ignore_invalid_experts vLLM reads expert_map values as local experts: one
    outside [-1, E) raises, compiled as eager."""
    emap = torch.arange(E, dtype=I32)
    emap[4] = E

    def align(ids):
        return V.moe_align_block_size(ids, BS, E, emap, ignore_invalid_experts=True,
                                      return_scatter_idx=True)  # fmt: skip

    _raises_eager_and_compiled(
        align, lambda: (_ids(),), re.escape(f"expert_map values must be -1 or in [0, {E})")
    )


def test_softmax_gates():
    """vLLM's topk_softmax (token_expert_indices written by the op) and SGLang's, each one op
    call on the common form: traced whole, the same bytes as eager."""
    g = torch.randn(M, 64, generator=torch.Generator().manual_seed(3))
    g[1, 5] = float("nan")

    def bufs():
        return (torch.empty(M, K), torch.empty(M, K, dtype=I32), torch.empty(M, K, dtype=I32))

    def vllm_gate(logits, w, ids, tei):
        CO.topk_softmax(w, ids, tei, logits, True)
        return w.clone(), ids.clone(), tei.clone()

    def sglang_gate(logits, w, ids):
        S.topk_softmax(w, ids, logits, False)
        return w.clone(), ids.clone()

    _same_compiled(vllm_gate, lambda: (g, *bufs()))
    _same_compiled(sglang_gate, lambda: (g, *bufs()[:2]))


def test_gate_errors_under_compile():
    """A refused call traced by dynamo raises the drop-in's error: in the peer's words
    where dynamo falls back to eager, with the op's message in dynamo's own error under
    ``fullgraph=True``."""
    g = torch.randn(M, 64)

    def gate(logits, w, ids, tei):
        CO.topk_softmax(w, ids, tei, logits, "yes")

    args = (g, torch.empty(M, K), torch.empty(M, K, dtype=I32), torch.empty(M, K, dtype=I32))
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="renormalize must be a bool, got 'yes'"):
        torch.compile(gate, backend="aot_eager")(*args)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="renormalize must be a bool") as info:
        torch.compile(gate, backend="aot_eager", fullgraph=True)(*args)
    assert "attribute" not in str(info.value)  # not dynamo refusing the message's rewrite


def test_aliased_buffers_inside_a_compiled_function():
    """Buffers that alias each other inside a compiled function: the op's fake kernel sees
    their shared storage while tracing and refuses them, as eager does; vLLM's is_padding
    aliasing the ids is read as it was before the gate wrote (traced code has no memory to
    compare), which is the call with a separate mask."""
    g = torch.randn(M, 64, generator=torch.Generator().manual_seed(5))

    def aliased(logits):
        w = torch.zeros(M, K)
        ops.moe_route_out(logits, K, w, w.view(I32))
        return w

    torch._dynamo.reset()
    with pytest.raises(Exception, match="topk_ids overlaps topk_weights"):
        torch.compile(aliased, backend="aot_eager", fullgraph=True)(g)

    def padded(logits):
        w, ids = torch.empty(M, K), torch.zeros(M, K, dtype=I32)
        ids[0, 0] = 1  # rows 0 of the mask below True, the others False
        tei = torch.empty(M, K, dtype=I32)
        CO.topk_softmax(w, ids, tei, logits, True, None, ids.view(torch.bool).view(-1)[:M])
        return ids

    def separate(logits):
        w, ids = torch.empty(M, K), torch.zeros(M, K, dtype=I32)
        ids[0, 0] = 1
        mask = ids.view(torch.bool).view(-1)[:M].clone()
        CO.topk_softmax(w, ids, torch.empty(M, K, dtype=I32), logits, True, None, mask)
        return ids

    torch._dynamo.reset()
    got = torch.compile(padded, backend="aot_eager", fullgraph=True)(g)
    assert torch.equal(got, separate(g))
    assert (got[0] == -1).all() and (got[1:] >= 0).all()
