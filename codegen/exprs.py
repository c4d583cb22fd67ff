"""The expressions of the op table (:mod:`codegen.ops`) rendered to Python and to C++.

An expression is Python syntax over names (size variables, int and float arguments, tensor
arguments) with ``+ - * // %``, comparisons, ``and / or / not``, ``is None`` / ``is not
None`` (optional tensors) and calls of the helpers below.  Each helper is defined once per
language: in Python by ``aiter_aux/validation`` (imported by the generated validators), in
C++ by ``csrc/kernels/mxfp4_moe/binding/checks.h``.  A message is a ``str.format``-style
template whose fields are such expressions.
"""

from __future__ import annotations

import ast
import json
import string
from dataclasses import dataclass

# helper -> (Python spelling, C++ spelling); "{0}" is the first argument
_CALLS = {
    "numel": ("{0}.numel()", None),  # C++: per tensor kind, see Scope
    "shape": ("_shape_str({0}.shape)", None),
    "sort_capacity": ("sort_capacity({args})", "aiter_aux_sort_capacity({args})"),
    "sort_scales_rows": ("sort_scales_rows({args})", "sort_scales_rows({args})"),
    "vllm_align_capacity": ("vllm_align_capacity({args})", "aiter_aux_vllm_align_capacity({args})"),
    "sglang_align_capacity": (
        "sglang_align_capacity({args})",
        "aiter_aux_sglang_align_capacity({args})",
    ),
    "max": ("max({args})", "std::max<int64_t>({args})"),
    "min": ("min({args})", "std::min<int64_t>({args})"),
    "rows_in_range": ("rows_in_range({args})", "rows_in_range({args})"),
    "expert_map_ptr": (None, "expert_map_ptr({args})"),
    "dtype_code": (None, "dtype_code({args})"),
    "size": (None, None),  # size(t, i): dim i of tensor t
}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: ("//", "/"), ast.Mod: "%"}
_CMPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


@dataclass
class Scope:
    """What the names of an expression are: ``tensors`` required tensor arguments,
    ``optional`` optional ones (``std::optional<Meta>`` in C++); any other name is an
    ``int64_t`` / ``double`` (C++) or int / float (Python) variable of the same name."""

    tensors: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()


class ExprError(ValueError):
    pass


def _parse(expr: str) -> ast.expr:
    try:
        return ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"bad expression {expr!r}: {e.msg}") from None


def to_python(expr: str, scope: Scope) -> str:
    _render(_parse(expr), scope, "py")  # validates the expression
    return ast.unparse(_PyCalls(scope).visit(_parse(expr)))


class _PyCalls(ast.NodeTransformer):
    """The helpers' Python spellings, as syntax (``ast.unparse`` then parenthesises only
    where precedence needs it)."""

    def __init__(self, scope: Scope):
        self.scope = scope

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        fn = node.func.id  # type: ignore[attr-defined]
        if fn == "numel":
            return ast.Call(ast.Attribute(node.args[0], "numel"), [], [])
        if fn == "size":
            return ast.Subscript(ast.Attribute(node.args[0], "shape"), node.args[1])
        if fn == "shape":
            return ast.Call(ast.Name("_shape_str"), [ast.Attribute(node.args[0], "shape")], [])
        return node


def to_cpp(expr: str, scope: Scope) -> str:
    return _render(_parse(expr), scope, "cpp")


def names(expr: str) -> set[str]:
    """The variable names an expression reads (helpers excluded)."""
    out = set()
    for node in ast.walk(_parse(expr)):
        if isinstance(node, ast.Name) and node.id not in _CALLS:
            out.add(node.id)
    return out


def _render(node: ast.expr, scope: Scope, lang: str) -> str:  # noqa: C901 (one case each)
    r = lambda n: _render(n, scope, lang)  # noqa: E731
    if isinstance(node, ast.Constant):
        if node.value is None:
            return "None" if lang == "py" else "nullptr"
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ExprError(f"constant {node.value!r} not supported")
        if lang == "cpp" and isinstance(node.value, int) and abs(node.value) > 2**31 - 1:
            return f"int64_t({node.value}LL)"
        return repr(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op = _BINOPS[type(node.op)]
        op = op if isinstance(op, str) else op[0 if lang == "py" else 1]
        return f"({r(node.left)} {op} {r(node.right)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return f"(not {r(node.operand)})" if lang == "py" else f"(!{r(node.operand)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"(-{r(node.operand)})"
    if isinstance(node, ast.BoolOp):
        op = {ast.And: ("and", "&&"), ast.Or: ("or", "||")}[type(node.op)][lang == "cpp"]
        return "(" + f" {op} ".join(r(v) for v in node.values) + ")"
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        (op,), (right,) = node.ops, node.comparators
        if isinstance(op, ast.Is | ast.IsNot):
            if not (isinstance(right, ast.Constant) and right.value is None):
                raise ExprError("'is' compares with None only")
            name = r(node.left)
            if lang == "py":
                return f"({name} {'is' if isinstance(op, ast.Is) else 'is not'} None)"
            return f"(!{name})" if isinstance(op, ast.Is) else f"bool({name})"
        if type(op) not in _CMPS:
            raise ExprError(f"comparison {type(op).__name__} not supported")
        return f"({r(node.left)} {_CMPS[type(op)]} {r(right)})"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
        return _call(node.func.id, node.args, scope, lang)
    raise ExprError(f"unsupported expression: {ast.unparse(node)}")


def _call(fn: str, args: list[ast.expr], scope: Scope, lang: str) -> str:
    py, cpp = _CALLS[fn]
    rendered = [_render(a, scope, lang) for a in args]
    if fn in ("numel", "shape"):
        (t,) = rendered
        if t not in scope.tensors | scope.optional:
            raise ExprError(f"{fn}() takes a tensor argument, got {t!r}")
        if lang == "py":
            return py.format(t)
        if fn == "numel":
            return f"opt_numel({t})" if t in scope.optional else f"{t}.numel"
        return f"{t}->shape()" if t in scope.optional else f"{t}.shape()"
    if fn == "size":
        t, i = rendered
        if t not in scope.tensors | scope.optional:
            raise ExprError(f"size() takes a tensor argument, got {t!r}")
        if lang == "py":
            return f"{t}.shape[{i}]"
        return f"{t}->size({i})" if t in scope.optional else f"{t}.size({i})"
    spelling = py if lang == "py" else cpp
    if spelling is None:
        raise ExprError(f"{fn}() has no {lang} spelling")
    return spelling.format(args=", ".join(rendered))


def _fields(template: str) -> list[tuple[str, str | None]]:
    """``[(literal, expression or None), ...]`` of a message template."""
    out = []
    for literal, field, spec, conv in string.Formatter().parse(template):
        if spec or conv:
            raise ExprError(f"format specs are not supported in {template!r}")
        out.append((literal, field))
    return out


def message_py(template: str, scope: Scope) -> str:
    """A Python f-string literal of ``template`` (a plain string without fields)."""
    fields = _fields(template)
    if all(f is None for _, f in fields):
        return json.dumps("".join(lit for lit, _ in fields))
    parts = []
    for literal, field in fields:
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            parts.append("{" + to_python(field, scope) + "}")
    return "f" + json.dumps("".join(parts))


def message_cpp(template: str, scope: Scope) -> str:
    """A C++ ``cat(...)`` call building ``template``."""
    parts = []
    for literal, field in _fields(template):
        if literal:
            parts.append(json.dumps(literal))
        if field is not None:
            parts.append(to_cpp(field, scope))
    return "cat(" + ", ".join(parts or ['""']) + ")"
