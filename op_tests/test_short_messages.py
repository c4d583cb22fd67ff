"""The errors of a call no instance serves are one short line with the fix in front, and
the error a user must catch when nothing may be built is public (no compile: the on-demand
builder is asked for a key with a stand-in module)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import aiter_aux  # noqa: E402
from aiter_aux.jit import ondemand, paths  # noqa: E402

LONGEST = 200  # characters of a missing-instance message, a drop-in's note included


class NoInstances:
    """A loaded module as ``ondemand.ensure`` sees it, without any instance."""

    backend = "cpu"

    def has(self, key: str) -> bool:
        return False

    def keys(self) -> list[str]:
        return []


def missing_message(monkeypatch, tmp_path, key: str) -> str:
    monkeypatch.setenv("AITER_AUX_DISABLE_JIT", "1")
    monkeypatch.setenv("AITER_AUX_CACHE_DIR", str(tmp_path))
    inst = paths.codegen_module("instances").instance_of_key(key)
    with pytest.raises(paths.JitDisabledError) as e:
        ondemand.ensure(NoInstances(), inst)
    return str(e.value)


def test_missing_instance_under_disable_jit_is_short_with_the_fix_first(monkeypatch, tmp_path):
    text = missing_message(monkeypatch, tmp_path, "moe_sort_e99_k9")
    assert text.startswith("no instance 'moe_sort_e99_k9' (fix: unset AITER_AUX_DISABLE_JIT"), text
    assert "\n" not in text and len(text) <= LONGEST, (len(text), text)


def test_a_catalog_key_under_disable_jit_says_to_build(monkeypatch, tmp_path):
    """A catalog shape's key that the loaded module (the one of no shape: the cache's catalog
    module is out of date, e.g. a shape added without a build) lacks: the fix is a build."""
    text = missing_message(monkeypatch, tmp_path, "moe_sort_e385_k9")
    assert text.startswith("no instance 'moe_sort_e385_k9' (fix: `aiter-aux build`"), text
    assert "out of date" in text and len(text) <= LONGEST


@pytest.mark.parametrize("drop_in", ["vllm", "sglang"])
def test_a_drop_ins_missing_instance_is_short_with_the_fix_first(monkeypatch, tmp_path, drop_in):
    """The drop-ins add their note to the op's message: still one line of at most LONGEST
    characters (they were 585-878)."""
    from aiter_aux import ops
    from aiter_aux.compat import sglang, vllm

    key = f"moe_align_block_size_{'vllm' if drop_in == 'vllm' else 'sglang'}_e900"
    text = missing_message(monkeypatch, tmp_path, key)

    def refuse(*args, **kwargs):
        raise ops.UnsupportedShapeError(text)

    from aiter_aux.compat import _align

    _align._t()  # the torch ops the drop-ins call: each refuses as a missing instance does
    monkeypatch.setattr(_align, "_T", list(_align._T[:2]) + [refuse, refuse])
    monkeypatch.setattr(_align, "_ALLOC", [refuse])
    monkeypatch.setattr(_align, "_FAST", _align._FAST[:1] + [refuse] * 4)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ops.UnsupportedShapeError) as e:
        if drop_in == "vllm":
            vllm.moe_align_block_size(ids, 16, 900)
        else:
            cap = ids.numel() * 16 + 901 * 15
            bufs = (torch.empty(n, dtype=torch.int32) for n in (cap, -(-cap // 16), 1))
            sglang.moe_align_block_size(ids, 901, 16, *bufs)
    msg = str(e.value)
    assert msg.startswith(f"no instance '{key}' (fix: "), msg
    assert "\n" not in msg and len(msg) <= LONGEST, (len(msg), msg)


def test_jit_disabled_error_is_public():
    """The error of an op call under AITER_AUX_DISABLE_JIT=1 with no module is catchable
    from the package itself."""
    assert aiter_aux.JitDisabledError is paths.JitDisabledError
    assert "JitDisabledError" in aiter_aux.ops.__all__
    assert issubclass(aiter_aux.JitDisabledError, RuntimeError)


def test_no_module_under_disable_jit_says_the_fix_first(monkeypatch, tmp_path):
    """An empty cache and AITER_AUX_DISABLE_JIT=1: the fix comes before the details."""
    from aiter_aux.jit import spec

    monkeypatch.setenv("AITER_AUX_DISABLE_JIT", "1")
    monkeypatch.setenv("AITER_AUX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(spec, "_LOADED", {})  # as in a process that loaded no module yet
    with pytest.raises(aiter_aux.JitDisabledError) as e:
        spec.ModuleSpec("cpu").load()
    text = str(e.value)
    assert text.startswith(
        "no cpu module_moe_mxfp4_aux and AITER_AUX_DISABLE_JIT=1 builds none "
        "(fix: unset it or run `aiter-aux build` first): "
    ), text
    assert "\n" not in text


@pytest.mark.parametrize("in_catalog", [True, False])
def test_why_an_instance_is_missing_is_short_with_the_fix_in_front(in_catalog):
    """The restart / add-shape note of a module that lacks a key: one line, the fix before
    the reasons, no paths."""
    from aiter_aux.jit import spec

    catalog = paths.catalog_on_disk(paths.source_root() / paths.CATALOG_FILE).SHAPES
    keys = [i.key for i in paths.codegen_module("instances").enumerate_instances(catalog)]
    key = keys[0] if in_catalog else "moe_sort_e99_k9"

    class Module(NoInstances):
        path = paths.source_root()

        def keys(self) -> list[str]:  # a catalog build of another catalog
            return ["moe_sort_e1_k1"]

    text = spec.why_missing(Module(), key)
    fix = "(fix: restart the process;" if in_catalog else "(fix: `aiter-aux add-shape"
    assert text.startswith(f"{key} is not in this process's cpu module"), text
    assert fix in text and "\n" not in text and len(text) <= LONGEST, (len(text), text)
    assert str(paths.source_root()) not in text


def test_a_module_of_no_shape_says_to_build_not_to_restart():
    """A cache holding only the module of no shape under AITER_AUX_DISABLE_JIT=1: restarting
    would not help; building (or JIT) does."""
    from aiter_aux.jit import spec

    catalog = paths.catalog_on_disk(paths.source_root() / paths.CATALOG_FILE).SHAPES
    key = paths.codegen_module("instances").enumerate_instances(catalog)[0].key
    text = spec.why_missing(NoInstances(), key)
    assert "restart the process;" not in text and "aiter-aux build" in text, text
    assert "\n" not in text and len(text) <= LONGEST, (len(text), text)


@pytest.mark.parametrize(
    "call",
    [
        lambda ids: aiter_aux.moe_align_block_size_sglang(ids, 1024, 32),  # the spec's check
        lambda ids: aiter_aux.moe_sort(ids, torch.rand(4, 2), 8, 33),  # the binding's check
        lambda ids: aiter_aux.moe_sort(ids, torch.rand(4, 3), 8, 32),
    ],
)
def test_an_ops_error_is_one_traceback(call):
    """A wrapper turns the binding's error into the spec's: the user sees that one error,
    not the binding's RuntimeError "during handling" of which it was raised."""
    import traceback

    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises((TypeError, ValueError)) as e:
        call(ids)
    text = "".join(traceback.format_exception(e.value))
    assert "During handling" not in text and "RuntimeError" not in text, text
