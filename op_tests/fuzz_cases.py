"""Input generators of ``test_conformance.py``: valid calls of every op on catalog (or chosen)
shapes, guarded poisoned ``out=`` buffers, and every single-argument corruption of a call
together with the exception it must raise and the argument names its message may cite."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from aiter_aux import reference as ref
from aiter_aux.ops.moe_mxfp4_aux import MXFP4_MOE_SUPPORTED_SHAPES

CATALOG = sorted(MXFP4_MOE_SUPPORTED_SHAPES)
POISON, GUARD = 0x5A, 16
SPECIAL_IDS = (-1, -2, 2**31 - 1, -(2**31), 1 << 24, 1025)
SORTS = ("moe_sort", "moe_sort_quant", "moe_sort_quant_fp8")  # the ops that sort
FUSED = ("moe_sort_quant", "moe_sort_quant_fp8")
ROUTED = ("moe_route_sort_quant", "moe_route_sort_quant_fp8")  # the gate, then FUSED's work
QUANTS = ("mxfp4_quant", "mxfp8_quant") + FUSED + ROUTED  # the ops that quantise x
FP8 = ("mxfp8_quant", "moe_sort_quant_fp8", "moe_route_sort_quant_fp8")  # a_q [M, model_dim]
GATES = ("moe_route",) + ROUTED  # the ops that take router_logits (any float dtype)
SUM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # moe_sum's input and output
ALIGNS = ("moe_align_block_size_vllm", "moe_align_block_size_sglang")  # the peers' formats


def guarded(shape, dtype, slack=0):
    """A poisoned contiguous buffer of ``shape`` (+ ``slack`` rows) inside poisoned guards;
    returns (buffer, whole allocation)."""
    rows = (shape[0] + slack,) + tuple(shape[1:])
    n = 1
    for s in rows:
        n *= s
    esize = torch.empty((), dtype=dtype).element_size()
    whole = torch.full(((n + 2 * GUARD) * esize,), POISON, dtype=torch.uint8)
    return whole.view(dtype)[GUARD : GUARD + n].view(rows), whole


def bits(g, shape, dtype):
    """Every bit pattern of ``dtype`` (NaN, ±Inf, subnormals, ±0) at random."""
    idt = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[
        dtype
    ]
    info = torch.iinfo(idt)
    return torch.randint(info.min, info.max + 1, shape, generator=g, dtype=idt).view(dtype)


def values(g, shape, dtype, kind):
    if kind == "bits":
        return bits(g, shape, dtype)
    scale = 10.0 ** torch.randint(-30, 30, shape[:1] + (1,) * (len(shape) - 1), generator=g)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def routing(g, m, e, k, nonlocal_p):
    ids = torch.randint(0, e, (m, k), generator=g, dtype=torch.int32)
    special = torch.tensor(SPECIAL_IDS + (e, e + 3), dtype=torch.int32)
    pick = special[torch.randint(0, len(special), (m, k), generator=g)]
    return torch.where(torch.rand(m, k, generator=g) < nonlocal_p, pick, ids)


def route_case(a: dict, outs: dict, d: st.DataObject, g, m: int, e: int, k: int, kind) -> int:
    """moe_route's inputs, options and outputs into ``a`` and ``outs``; returns its topk."""
    a["router_logits"] = values(g, (m, e), d.draw(st.sampled_from(SUM_DTYPES), "dtype"), kind)
    k = a["topk"] = min(k, 16, e)
    a["scoring"] = d.draw(st.sampled_from(["softmax", "sigmoid", "none"]), "scoring")
    a["renormalize"] = d.draw(st.booleans(), "renormalize")
    groups = [n for n in (1, 2, 4, 8, 16, e) if e % n == 0]
    if d.draw(st.booleans(), "grouped"):
        n = d.draw(st.sampled_from(groups), "num_expert_group")
        a["num_expert_group"] = n
        a["topk_group"] = d.draw(st.integers(-(-k // (e // n)), n), "topk_group")
    if d.draw(st.booleans(), "bias"):
        a["correction_bias"] = values(g, (e,), torch.float32, kind)
    if d.draw(st.booleans(), "scale"):
        a["routed_scaling_factor"] = d.draw(st.sampled_from([2.5, -0.75, 0.0, 1e-30]), "f")
    outs["topk_weights"] = ((m, k), torch.float32)
    outs["topk_ids"] = ((m, k), torch.int32)
    return k


def make_case(op, d: st.DataObject, m_min=0, shape=None):
    """Valid inputs of ``op`` for a random catalog shape (or ``shape``): (inputs, out
    shapes and dtypes)."""
    e, dim, _inter, k = shape or d.draw(st.sampled_from(CATALOG), "shape")
    m = d.draw(st.integers(m_min, 40), "M")
    g = torch.Generator().manual_seed(d.draw(st.integers(0, 2**32), "seed"))
    kind = d.draw(st.sampled_from(["normal", "bits"]), "kind")
    bm = d.draw(st.sampled_from([16, 32, 64, 128]), "block_m")
    a: dict = {}
    outs: dict = {}
    if op in GATES:  # any dtype; groups, bias, options drawn independently
        k = route_case(a, outs, d, g, m, e, k, kind)
    if op in SORTS:
        p = d.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]), "nonlocal")
        a["topk_ids"] = routing(g, m, e, k, p)
        a["topk_weights"] = values(g, (m, k), torch.float32, kind)
    if op in SORTS + ROUTED:
        rows = ref.moe_sort_capacity(m, k, e, bm)
        outs["out"] = [
            ((rows,), torch.int32),
            ((rows,), torch.float32),
            ((rows,), torch.int32),
            ((rows // bm,), torch.int32),
            ((2,), torch.int32),
            ((m * k,), torch.int32),
        ]
    if op in QUANTS:
        a["x"] = values(g, (m, dim), torch.bfloat16, kind)
        outs["a_q"] = ((m, dim if op in FP8 else dim // 2), torch.uint8)
        outs["a_scale"] = ((m, dim // 32), torch.uint8)
    if op in SORTS + ROUTED:
        a["num_experts"], a["block_m"] = e, bm
        if d.draw(st.booleans(), "zero_buf"):
            a["zero_buf"] = values(g, (d.draw(st.integers(0, 300)),), torch.bfloat16, "bits")
    if op in FUSED + ROUTED and dim % 256 == 0 and d.draw(st.booleans(), "sorted_scales"):
        # the decode step in one call: a mutated buffer, fuzzed as an output
        b = max(32, bm)
        out_rows = -(-ref.moe_sort_capacity(m, k, e, bm) // b) * b
        outs["sorted_scales"] = ((out_rows, dim // 32), torch.uint8)
    if op == "moe_sort_scales":
        a["a_scale"] = torch.randint(0, 256, (m, dim // 32), generator=g, dtype=torch.uint8)
        s = ref.moe_sort(routing(g, m, e, k, 0.2), torch.rand(m, k, generator=g), e, bm)
        sti, nv = s.sorted_token_ids, s.num_valid_ids
        if d.draw(st.booleans(), "garbage"):  # the spec defines the result for any values
            sti = torch.randint(-(2**31), 2**31, sti.shape, generator=g, dtype=torch.int32)
            nv = torch.randint(-(2**31), 2**31, (2,), generator=g, dtype=torch.int32)
        a.update(sorted_token_ids=sti, num_valid_ids=nv, block_m=bm)
        out_rows = -(-sti.numel() // max(32, bm)) * max(32, bm)
        outs["sorted_scales"] = ((out_rows, dim // 32), torch.uint8)
    if op.startswith("moe_scatter_reduce"):
        rows = d.draw(st.integers(0, 3 * m + 4), "rows")
        if op == "moe_scatter_reduce":
            a["expert_out"] = values(g, (rows, dim), torch.bfloat16, kind)
        else:
            a["expert_out_q"] = torch.randint(0, 256, (rows, dim // 2), generator=g,
                                              dtype=torch.uint8)  # fmt: skip
            a["expert_out_scale"] = torch.randint(100, 256, (rows, dim // 32), generator=g,
                                                  dtype=torch.uint8)  # fmt: skip
        low = -3 if rows else -(2**31)
        a["reverse_sorted"] = torch.randint(low, max(rows, 0) or -1, (m * k,), generator=g,
                                            dtype=torch.int32)  # fmt: skip
        a["sorted_weights"] = values(g, (rows + d.draw(st.integers(0, 3)),), torch.float32, kind)
        a["topk"] = k
        outs["out"] = ((m, dim), torch.bfloat16)
    if op == "moe_sum":  # any hidden size and dtype; options drawn independently
        dt = d.draw(st.sampled_from(SUM_DTYPES), "dtype")
        hidden = d.draw(st.sampled_from([dim, 1, 7, 100]), "hidden")
        a["input"] = values(g, (m, k, hidden), dt, kind)
        if d.draw(st.booleans(), "topk_ids"):
            a["topk_ids"] = routing(g, m, e, k, d.draw(st.sampled_from([0.0, 0.3, 1.0]), "p"))
            if d.draw(st.booleans(), "expert_map"):
                n = d.draw(st.sampled_from([0, e // 2, e, e + 5]), "map_len")
                a["expert_map"] = torch.randint(-2, max(e, 1), (n,), generator=g, dtype=torch.int32)
        if d.draw(st.booleans(), "scale"):
            a["routed_scaling_factor"] = d.draw(st.sampled_from([2.5, -0.75, 0.0, 1e-30]), "f")
        outs["output"] = ((m, hidden), dt)
    if op in ALIGNS:
        p = d.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]), "nonlocal")
        a["topk_ids"] = routing(g, m, e, k, p)
        bm = d.draw(st.sampled_from([bm, 1, 8, 48]), "block_size")  # any block size
        a["num_experts"], a["block_size"] = e, bm
        cap_fn = (
            ref.compat.vllm_align_capacity if "vllm" in op else ref.compat.sglang_align_capacity
        )
        cap = cap_fn(m * k, e, bm)
        outs["sorted_token_ids"] = ((cap,), torch.int32)
        outs["expert_ids"] = ((-(-cap // bm),), torch.int32)
        outs["num_tokens_post_pad"] = ((1,), torch.int32)
        outs["scatter_idx"] = ((m * k,), torch.int32)
        kind = d.draw(st.sampled_from(["none", "expert_map", "block_expert_map"]), "map")
        if "vllm" in op and kind != "none":  # values out of range included (dropped)
            n = e + d.draw(st.integers(0, 3), "map_extra")
            a[kind] = torch.randint(-2, e + 2, (n,), generator=g, dtype=torch.int32)
    if not a:
        raise KeyError(f"no input builder for op {op!r}: add its case to make_case")
    return a, outs


def alloc_outs(outs: dict, slack: int):
    """Guarded poisoned buffers for ``outs``: (kwargs, list of whole allocations)."""
    kw, wholes = {}, []
    for name, spec in outs.items():
        if isinstance(spec, list):  # MoeSortOutput
            pairs = [guarded(shape, dt, slack) for shape, dt in spec]
            kw[name] = ref.MoeSortOutput(*(b for b, _ in pairs))
            wholes += [w for _, w in pairs]
        else:
            buf, whole = guarded(spec[0], spec[1], slack)
            kw[name], wholes = buf, wholes + [whole]
    return kw, wholes


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def guards_ok(whole: torch.Tensor) -> bool:
    n = GUARD * whole.element_size()
    b = raw(whole)
    return b[:n].count(POISON) == n and b[-n:].count(POISON) == n


def defined(op, result, bm):
    """The bytes an allocating op defines (sort rows past num_valid_ids[0] are not)."""
    alone = not isinstance(result, tuple) or isinstance(result, ref.MoeSortOutput)
    result = (result,) if alone else result  # moe_sort's MoeSortOutput is one result
    if op in SORTS + ROUTED:
        at = 2 if op in ROUTED else 0  # the MoeSortOutput's place in the result
        s = result[at]
        n = int(s.num_valid_ids[0])
        parts = [s.sorted_token_ids[:n], s.sorted_weights[:n], s.m_indices[:n],
                 s.sorted_expert_ids[: n // bm], s.num_valid_ids, s.reverse_sorted]  # fmt: skip
        result = list(result[:at]) + parts + list(result[at + 1 :])
    return [raw(p) for p in result]


WRONG_DTYPE = {torch.int32: torch.int64, torch.float32: torch.float64,
               torch.bfloat16: torch.float16, torch.uint8: torch.int8}  # fmt: skip
BAD_INTS = {"block_m": [(8, ValueError), (48, ValueError), (256, ValueError), (True, TypeError),
                        (32.0, TypeError)],
            "num_experts": [(0, ValueError), (1025, ValueError), ("8", TypeError)],
            "topk": [(0, ValueError), (256, ValueError), (2.0, TypeError)]}  # fmt: skip
# the align ops take any block size in [1, 65536] (the peers' formats)
BAD_INTS["block_size"] = [(0, ValueError), (65537, ValueError), (True, TypeError),
                          (32.0, TypeError)]  # fmt: skip


BAD_SCALES = (True, torch.tensor(2.0), "2.0", None)  # not a Python int or float


def noncontig(t):
    if t.dim() == 0 or t.shape[-1] < 2 or t.numel() == 0:  # else it is contiguous anyway
        return None
    nc = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]
    return nc.copy_(t)


def slots(kw: dict):
    """(name, tensor, change) of every tensor argument; sort out buffers one by one."""
    for name, v in kw.items():
        if isinstance(v, ref.MoeSortOutput):
            for f in v._fields:
                yield f, getattr(v, f), lambda x, n=name, f=f: {n: kw[n]._replace(**{f: x})}
        elif isinstance(v, torch.Tensor):
            yield name, v, lambda x, n=name: {n: x}


def corruptions(op, a: dict, outs: dict) -> list:
    """Single-argument corruptions of a valid call: (label, changes, exception, names)."""
    n_inputs = sum(isinstance(v, torch.Tensor) for v in a.values())
    cases = []
    for name, t, put in slots({**a, **outs}):
        is_out = name not in a
        any_float = op in ("moe_sum",) + GATES and t.is_floating_point()  # f16 is valid
        wrong = torch.float64 if any_float else WRONG_DTYPE[t.dtype]
        if name == "topk_ids":  # the wrappers take int64 ids (narrowed), not int16
            wrong = torch.int16
        cases += [(f"{name}:dtype", put(t.to(wrong)), TypeError, {name}),
                  (f"{name}:list", put(t.tolist()), TypeError, {name})]  # fmt: skip
        if name != "zero_buf":
            cases.append((f"{name}:rank", put(t.unsqueeze(0)), ValueError, {name}))
        if noncontig(t) is not None:
            cases.append((f"{name}:noncontig", put(noncontig(t)), ValueError, {name}))
        if t.dim() >= 1:
            cases.append((f"{name}:sparse", put(t.to_sparse()), ValueError, {name}))
        if n_inputs > 1 or is_out or name == "zero_buf":  # one meta tensor among cpu ones
            cases.append((f"{name}:meta", put(t.to("meta")), ValueError, {name}))
        if is_out and t.numel() > 0:
            cases.append((f"{name}:small", put(t[:-1]), ValueError, {name}))
            if t.dim() == 2 and t.shape[1] >= 2 and t.shape[1] % 2 == 0:
                cases.append((f"{name}:cols", put(t.view(-1, t.shape[1] // 2)), ValueError,
                              {name}))  # fmt: skip
    for name, bad in BAD_INTS.items():
        cases += [(f"{name}={v!r}", {name: v}, exc, {name}) for v, exc in bad if name in a]
    if "topk" in a and "expert_out" in a or "expert_out_q" in a or op in ("moe_sum",) + GATES:
        for v in BAD_SCALES:
            cases.append((f"routed_scaling_factor={v!r}", {"routed_scaling_factor": v},
                          TypeError, {"routed_scaling_factor"}))  # fmt: skip
    if "out" in outs and isinstance(outs["out"], ref.MoeSortOutput):
        cases.append(("out:len5", {"out": tuple(outs["out"])[:5]}, TypeError, {"out"}))
    if "topk_weights" in a:
        cases.append(("w:rows", {"topk_weights": a["topk_weights"][:-1]}, ValueError,
                      {"topk_weights"}))  # fmt: skip
    if "x" in a:
        bad_d = a["x"][:, :-16].contiguous()  # model_dim not a multiple of 32
        cases.append(("x:model_dim", {"x": bad_d}, ValueError, {"x", "model_dim"}))
        if "topk_ids" in a or "router_logits" in a:
            cases.append(("x:rows", {"x": a["x"][:-1]}, ValueError, {"x"}))
    if op == "moe_sort_scales":
        cases += [("a_scale:cols", {"a_scale": a["a_scale"][:, :-1].contiguous()}, ValueError,
                   {"a_scale"}),
                  ("sti:len", {"sorted_token_ids": a["sorted_token_ids"][:-1]}, ValueError,
                   {"sorted_token_ids"}),
                  ("nv:len", {"num_valid_ids": a["num_valid_ids"][:1]}, ValueError,
                   {"num_valid_ids"})]  # fmt: skip
    if op.startswith("moe_scatter_reduce"):
        src = a.get("expert_out", a.get("expert_out_scale"))
        rows, rev = src.shape[0], a["reverse_sorted"]
        for big in (rows, 2**31 - 1):
            r2 = rev.clone()
            r2[0] = big
            cases.append((f"rev>={big}", {"reverse_sorted": r2}, ValueError, {"reverse_sorted"}))
        if rows:
            cases.append(("w:short", {"sorted_weights": a["sorted_weights"][: rows - 1]},
                          ValueError, {"sorted_weights"}))  # fmt: skip
        if a["topk"] > 1:
            cases.append(("rev:len", {"reverse_sorted": rev[:-1]}, ValueError,
                          {"reverse_sorted", "topk"}))  # fmt: skip
        for name in ("expert_out", "expert_out_scale"):
            if name in a:
                cases.append((f"{name}:0cols", {name: a[name][:, :0]}, ValueError, {name}))
        if "expert_out_q" in a:
            q = a["expert_out_q"][:, :-2].contiguous()
            cases.append(("q:cols", {"expert_out_q": q}, ValueError, {"expert_out_q"}))
    if op == "moe_sum":
        x = a["input"]
        cases.append(("input:topk0", {"input": x[:, :0].contiguous()}, ValueError, {"input"}))
        ids = a.get("topk_ids")
        if ids is None:
            m_map = torch.zeros(3, dtype=torch.int32)
            cases.append(("map without ids", {"expert_map": m_map}, ValueError, {"expert_map"}))
        elif ids.shape[1] > 1:
            cases.append(("topk_ids:cols", {"topk_ids": ids[:, :-1].contiguous()}, ValueError,
                          {"topk_ids"}))  # fmt: skip
            cases.append(("topk_ids:rows", {"topk_ids": torch.cat([ids, ids[:1]])}, ValueError,
                          {"topk_ids"}))  # fmt: skip
    if op in GATES:
        e, k = a["router_logits"].shape[1], a["topk"]
        cases += [
            ("bias:len", {"correction_bias": torch.zeros(e + 1)}, ValueError, {"correction_bias"}),
            ("scoring", {"scoring": "relu"}, ValueError, {"scoring"}),
            ("renormalize", {"renormalize": "no"}, TypeError, {"renormalize"}),
            ("group alone", {"num_expert_group": 1, "topk_group": None}, ValueError,
             {"num_expert_group"}),
            ("topk_group", {"num_expert_group": 1, "topk_group": 2}, ValueError, {"topk_group"}),
            ("topk > E", {"topk": e + 1}, ValueError, {"topk"}),
        ]  # fmt: skip
        if e > 1 and e % 2:
            cases.append(("groups", {"num_expert_group": 2, "topk_group": 1}, ValueError,
                          {"num_expert_group"}))  # fmt: skip
        if e % 2 == 0 and k > e // 2:
            cases.append(("kept", {"num_expert_group": 2, "topk_group": 1}, ValueError,
                          {"topk"}))  # fmt: skip
    return cases


def untouched(wholes) -> bool:
    return all(raw(w).count(POISON) == w.numel() * w.element_size() for w in wholes)


def tensor_names(kw: dict) -> set[str]:
    return {name for name, _t, _put in slots(kw)}


def outside_catalog(op, d) -> tuple[int, int, int, int]:
    """A shape none of whose instances of ``op`` is in the catalog (the values are drawn
    from lists that leave out whatever the catalog holds)."""
    dims = sorted({256, 1024, 2048, 8192, 12288} - {s[1] for s in CATALOG})
    experts = sorted({1, 7, 100, 1000, 1024} - {s[0] for s in CATALOG})
    if op == "moe_align_block_size_sglang":  # num_experts + 1 buckets <= 1024
        experts = [x for x in experts if x < 1024]
    topks = sorted({1, 5, 7} - {s[3] for s in CATALOG})
    e = d.draw(st.sampled_from(experts), "E")
    k = d.draw(st.sampled_from(topks), "k")
    dim = d.draw(st.sampled_from(dims), "d")
    return (e, dim, 256, min(k, e))
