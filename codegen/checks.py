"""The argument checks of one op call, from the op table, as C++ and as Python source.

:class:`CallPlan` walks an :class:`~codegen.opspec.OpSpec` once, in the order the op table's
docstring defines, and emits the same steps in both languages: the binding's function body
(``templates/binding.j2``) and the Python validator (``aiter_aux/validation/_checks.py``),
so the compiled ops and the reference reject a call with the same error and message.
"""

from __future__ import annotations

from . import exprs
from .limits import LIMITS
from .opspec import Code, Float, Int, Limit, OpSpec, Rule, Size, Tensor

CPP_DTYPE = {"int32": "kInt32()", "float32": "kFloat32()", "bfloat16": "kBFloat16()",
             "uint8": "kUInt8()", "float": "kFloats()"}  # fmt: skip
CPP_ELEM = {"int32": "int32_t", "float32": "float", "bfloat16": "uint16_t", "uint8": "uint8_t",
            "float": "void"}  # fmt: skip
#: The dtypes a tensor may have besides one fixed dtype: "float" (float32, float16 or
#: bfloat16, the kernel takes the dtype_code) and "=<tensor>" (that tensor's dtype).
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def cpp_dtype(dtype: str) -> str:
    """The C++ ``DType`` expression of a table dtype."""
    return f"same_dtype({dtype[1:]})" if dtype.startswith("=") else CPP_DTYPE[dtype]


def cpp_elem(dtype: str) -> str:
    """The element type of a data pointer of a table dtype (``void`` for a dtype set)."""
    return "void" if dtype.startswith("=") else CPP_ELEM[dtype]


def py_dtype(dtype: str) -> str:
    """The Python spelling of a table dtype (a dtype, a tuple of them, ``<tensor>.dtype``)."""
    return f"{dtype[1:]}.dtype" if dtype.startswith("=") else PY_DTYPE[dtype]


def _limit_cond(var: str, name: str) -> tuple[str, str]:
    """(condition, message template) of a limit check of ``var``."""
    lim = LIMITS[name]
    if lim.values:
        cond = " or ".join(f"{var} == {v}" for v in lim.values)
    else:
        cond = f"{var} >= {lim.lo} and {var} {'<' if lim.hi_open else '<='} {lim.hi}"
    # an argument with the limit of another name (block_size: block_m's) is named itself
    label = var if lim.name == name and var != name else lim.name
    return cond, f"{label} {lim.rule}, got {{{var}}}"


class CallPlan:
    """The checks of ``spec``'s ``<op>_out`` (``out=True``) or allocating call."""

    def __init__(self, spec: OpSpec, out: bool):
        self.spec, self.out = spec, out
        tensors = spec.tensors()
        self.required = [t for t in tensors if not t.optional]
        self.opt_read = [t for t in tensors if t.optional and not t.buffer]
        self.buf_opts = [t for t in tensors if t.buffer]
        self.outputs = list(spec.outputs) if out else []
        # outputs: bound in both forms by the time the struct is filled (allocated or given)
        req = {t.name for t in self.required} | {o.name for o in spec.outputs}
        self.scope = exprs.Scope(frozenset(req), frozenset(t.name for t in tensors if t.optional))
        self.first = self.required[0].name
        self.sizes: list[str] = []  # size variables, in binding order

    # ------------------------------------------------------------------ steps
    def steps(self):
        """``(kind, data)`` steps in check order."""
        self.sizes = []
        bound: set[str] = {a.name for a in self.spec.args() if isinstance(a, Int | Float)}
        for t in self.required:
            binds, checks = [], []
            for i, d in enumerate(t.dims or ()):
                if d.isidentifier() and d not in bound:
                    binds.append((d, i))
                    bound.add(d)
                else:
                    checks.append(d)
            yield "tensor", (t, binds, t.dims if checks else None)
            self.sizes += [d for d, _ in binds]
        for t in self.opt_read:
            yield "option", t
        for a in self.spec.args():
            if isinstance(a, Int | Float):
                yield "scalar", a
        for a in self.spec.args():
            if isinstance(a, Code):
                yield "rule", Rule(*a.code_rule)
        buffer_rules = {c for c in self.spec.checks if isinstance(c, Rule) and c.when in
                        {t.name for t in self.buf_opts}}  # fmt: skip
        for c in self.spec.checks:
            if isinstance(c, Limit):
                yield "rule", Rule(*_limit_cond(c.var, c.limit))
            elif isinstance(c, Size):
                self.sizes.append(c.name)
                yield "size", c
            elif c not in buffer_rules:
                yield "rule", c
        for t in self.outputs:
            yield "buffer", t
        for t in self.buf_opts:
            yield "buffer", t
            for c in buffer_rules:
                if c.when == t.name:
                    yield "rule", c
        written = [t.name for t in self.outputs] + [
            t.name for t in self.spec.tensors() if t.written
        ]
        read = [t.name for t in self.spec.tensors() if not t.written]
        yield "overlap", (written, read)
        for d in self.spec.data_checks:
            yield "data", d

    # ------------------------------------------------------------------ C++
    def cpp(self) -> list[str]:
        """The body of the binding function up to (not including) the launch."""
        out, s = [], self.scope
        for kind, data in self.steps():
            if kind == "tensor":
                t, binds, shape = data
                out.append(f'const Meta {t.name}({t.name}_, "{t.name}");')
                out.append(self._cpp_tensor(t, t.name))
                if t.name != self.first:
                    out.append(f"check_device({t.name}, {self.first});")
                for d, i in binds:
                    out.append(f"const int64_t {d} = {t.name}.size({i});")
                if shape is not None:
                    dims = ", ".join(exprs.to_cpp(d, s) for d in shape)
                    out.append(f'check_shape({t.name}, {{{dims}}}, "{t.shape_text}");')
            elif kind == "option":
                t = data
                out.append(f'const std::optional<Meta> {t.name} = '
                           f'optional_meta({t.name}_, "{t.name}");')  # fmt: skip
                out.append(f"if ({t.name}) {{")
                out.append("  " + self._cpp_tensor(t, f"*{t.name}"))
                out.append(f"  check_device(*{t.name}, {self.first});")
                out.append("}")
            elif kind == "scalar" and isinstance(data, Float):  # as _float in Python
                out.append(f'check_finite({data.name}, "{data.name}");')
            elif kind == "rule":
                cond = exprs.to_cpp(data.cond, s)
                if data.when:
                    cond = f"!{data.when} || {cond}"
                msg = exprs.message_cpp(data.message, s)
                out.append(f'if (!({cond})) fail("{data.error}", {msg});')
            elif kind == "size":
                out.append(f"const int64_t {data.name} = {exprs.to_cpp(data.expr, s)};")
            elif kind == "buffer":
                out += self._cpp_buffer(data)
            elif kind == "overlap":
                w, r = data
                out.append(f"check_no_overlap({{{self._ptrs(w)}}}, {{{self._ptrs(r)}}});")
            elif kind == "data":
                out.append(exprs.to_cpp(data, s) + ";")
        return out

    def _cpp_tensor(self, t: Tensor, ref: str) -> str:
        ndim = len(t.dims) if t.dims is not None else -1
        layout = f', "{t.shape_text}"' if t.dims is not None else ""
        return f"check_tensor({ref}, {cpp_dtype(t.dtype)}, {ndim}{layout});"

    def _cpp_buffer(self, t: Tensor) -> list[str]:
        s = self.scope
        dims = [exprs.to_cpp(d, s) for d in t.dims]
        needed = " * ".join(dims)
        cols = f", {dims[1]}" if len(dims) == 2 else ""
        if t.optional:
            return [
                f'const std::optional<Meta> {t.name} = optional_meta({t.name}_, "{t.name}");',
                f"if ({t.name}) check_buffer(*{t.name}, {cpp_dtype(t.dtype)}, {needed}, "
                f"{self.first}, {len(dims)}{cols});",
            ]
        meta = f'const Meta {t.name}({t.name}_, "{t.name}");'
        return [meta, f"check_buffer({t.name}, {cpp_dtype(t.dtype)}, {needed}, {self.first}, "
                      f"{len(dims)}{cols});"]  # fmt: skip

    def _ptrs(self, names: list[str]) -> str:
        opt = self.scope.optional
        return ", ".join(f"opt_ptr({n})" if n in opt else f"&{n}" for n in names)

    def cpp_alloc(self) -> list[str]:
        """Allocating form: the outputs as new tensors and their Metas."""
        s, out = self.scope, []
        for t in self.spec.outputs:
            dims = ", ".join(exprs.to_cpp(d, s) for d in t.dims)
            out.append(f"Tensor {t.name}_ = empty({self.first}, {{{dims}}}, {cpp_dtype(t.dtype)});")
            out.append(f'const Meta {t.name}({t.name}_, "{t.name}");')
        return out

    def cpp_fill(self, fill) -> str:
        """The aggregate initialiser of the args struct."""
        if isinstance(fill, tuple):
            return "{" + ", ".join(self.cpp_fill(f) for f in fill) + "}"
        written = {o.name for o in self.spec.outputs} | {
            t.name for t in self.spec.tensors() if t.written
        }
        dtypes = {t.name: t.dtype for t in self.spec.tensors() + self.spec.outputs}
        floats = {a.name for a in self.spec.args() if isinstance(a, Float)}
        if fill in dtypes:
            elem = cpp_elem(dtypes[fill])
            typ = elem if fill in written else f"const {elem}"
            ref = f"opt_ptr({fill})" if fill in self.scope.optional else fill
            return f"ptr<{typ}>({ref})"
        if fill in floats:
            return f"float({fill})"
        if fill in ("0", "nullptr") or fill.startswith("expert_map_ptr("):  # not an int
            return exprs.to_cpp(fill, self.scope) if fill != "nullptr" else fill
        return f"I{{{exprs.to_cpp(fill, self.scope)}}}"

    # ------------------------------------------------------------------ Python
    def py(self) -> list[str]:
        """The body of the Python validator; it ends returning the sizes."""
        out, s = [], self.scope
        first_seen = False
        for kind, data in self.steps():
            if kind == "tensor":
                t, binds, shape = data
                out.append(self._py_tensor(t, wide=True))
                if first_seen:
                    out.append(f'_same_device({t.name}, "{t.name}", {self.first}, '
                               f'"{self.first}")')  # fmt: skip
                first_seen = True
                for d, i in binds:
                    out.append(f"{d} = {t.name}.shape[{i}]")
                if shape is not None:
                    dims = ", ".join(exprs.to_python(d, s) for d in shape)
                    out.append(f'_check_shape({t.name}, "{t.name}", ({dims},), '
                               f'"{t.shape_text}")')  # fmt: skip
            elif kind == "option":
                t = data
                out.append(f"if {t.name} is not None:")
                out.append("    " + self._py_tensor(t, wide=True))
                out.append(f'    _same_device({t.name}, "{t.name}", {self.first}, '
                           f'"{self.first}")')  # fmt: skip
            elif kind == "scalar":
                a = data
                fn = "_int" if isinstance(a, Int) else "_float"
                out.append(f'{a.name} = {fn}({a.name}, "{a.name}")')
            elif kind == "rule":
                cond = exprs.to_python(data.cond, s)
                if data.when:
                    cond = f"{data.when} is None or {cond}"
                msg = exprs.message_py(data.message, s)
                out.append(f"if not ({cond}):")
                out.append(f"    raise {data.error}({msg})")
            elif kind == "size":
                out.append(f"{data.name} = {exprs.to_python(data.expr, s)}")
            elif kind == "buffer":
                out += self._py_buffer(data)
            elif kind == "overlap":
                w, r = data
                out.append(f"_no_overlap({self._py_dict(w)}, {self._py_dict(r)})")
            elif kind == "data":
                out.append("if read_data:")
                out.append("    " + exprs.to_python(data, s))
        fields = ", ".join(self.sizes)
        out.append(f"return {self.sizes_type}({fields})")
        return out

    @property
    def sizes_type(self) -> str:
        return "".join(p.title() for p in self.spec.name.split("_")) + "Sizes"

    def _py_tensor(self, t: Tensor, wide: bool = False) -> str:
        """The check of ``t``; ``wide``: in a validator, whose ``wide_ids`` widens an id
        tensor of :data:`WIDE_IDS` to int32 or int64."""
        ndim = len(t.dims) if t.dims is not None else None
        layout = f'"{t.shape_text}"' if t.dims is not None else "None"
        dtype = py_dtype(t.dtype)
        if wide and t.name in WIDE_IDS:
            dtype = f"(_ids if wide_ids else {dtype})"
        return f'_tensor({t.name}, "{t.name}", {dtype}, {ndim}, {layout})'

    def _py_buffer(self, t: Tensor) -> list[str]:
        s = self.scope
        dims = [exprs.to_python(d, s) for d in t.dims]
        needed = " * ".join(d if d.isidentifier() or d.isdigit() else f"({d})" for d in dims)
        cols = f", cols={dims[1]}" if len(dims) == 2 else ""
        call = (f'_buffer({t.name}, "{t.name}", {py_dtype(t.dtype)}, {needed}, '
                f'{self.first}, "{self.first}", {len(dims)}{cols})')  # fmt: skip
        if t.optional:
            return [f"if {t.name} is not None:", "    " + call]
        return [call]

    @staticmethod
    def _py_dict(names: list[str]) -> str:
        return "{" + ", ".join(f'"{n}": {n}' for n in names) + "}"


PY_DTYPE = {"int32": "_i32", "float32": "_f32", "bfloat16": "_bf16", "uint8": "_u8",
            "float": "_floats"}  # fmt: skip

#: Id tensors (int32 in the table) that the Python wrappers of ``aiter_aux.ops`` also take as
#: int64, narrowed to int32 by ``_library._ids32`` (every id keeps its meaning: docs/ops.md);
#: the binding, ``torch.ops.aiter_aux`` and the reference take int32.  The validator of an
#: op with one takes ``wide_ids``: the wrappers' checks pass True, and its dtype message
#: then names both dtypes.
WIDE_IDS = ("topk_ids",)


def has_wide_ids(spec: OpSpec) -> bool:
    """``spec`` has an id tensor of :data:`WIDE_IDS` (its wrappers take int64 ids)."""
    return any(t.name in WIDE_IDS for t in spec.tensors())


def cpp_params(spec: OpSpec, out: bool) -> str:
    """The binding function's parameters, in schema order (tensors get a ``_`` suffix: the
    plain name is the checked :class:`Meta`)."""

    def one(a) -> str:
        if isinstance(a, Int):
            return f"int64_t {a.name}"
        if isinstance(a, Float):
            return f"double {a.name}"
        if a.optional:
            return f"const std::optional<Tensor>& {a.name}_"
        return f"const Tensor& {a.name}_"

    args = list(spec.inputs) + (list(spec.outputs) if out else []) + list(spec.options)
    return ", ".join(one(a) for a in args)


def cpp_function(spec: OpSpec, out: bool) -> dict:
    """What templates/binding.j2 needs to render one binding function."""
    plan = CallPlan(spec, out)
    body = plan.cpp()
    n = len(spec.outputs)
    ret = "void" if out else ("Tensor" if n == 1 else f"std::tuple<{', '.join(['Tensor'] * n)}>")
    returns = ", ".join(f"{o.name}_" for o in spec.outputs)
    # the instances it launches: its own, or each part's of a composed op (on that member of
    # its args), their parameters the op's of the same names
    parts = [(spec, "")]
    if spec.composes:
        from .ops import OPS

        parts = [(OPS[op], "." + member) for op, member in spec.composes]
    launches = [{"op_id": p.op_id, "member": member,
                 "values": ", ".join(f"int32_t({v})" for v in p.params) or "0"}
                for p, member in parts]  # fmt: skip
    return {
        "name": spec.name + ("_out" if out else ""),
        "ret": ret,
        "params": cpp_params(spec, out),
        "checks": body,
        "launches": launches,
        "alloc": [] if out else plan.cpp_alloc(),
        "struct": spec.struct,
        "fill": plan.cpp_fill(spec.fill),
        "first": plan.first,
        "returns": None if out else (returns if n == 1 else "{" + returns + "}"),
    }
