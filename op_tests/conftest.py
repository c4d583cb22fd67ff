"""Shared fixtures.  Must stay importable without torch: the codegen test runs in a
torch-free environment."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


def pytest_collection_modifyitems(items):
    """Tests parametrized with ``device="cuda"`` are GPU tests (marker ``gpu``)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("device") == "cuda":
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def cpu_module():
    """The CPU module of the whole catalog, built (or found in the cache) once per session.
    Cache: $AITER_AUX_CACHE_DIR, default ~/.cache/aiter_aux, shared with `aiter-aux build`."""
    if not HAS_TORCH:
        pytest.skip("torch is not installed")
    from aiter_aux.jit.build import build_module
    from aiter_aux.jit.spec import load_module

    result = build_module(backend="cpu")
    assert result.module_path.is_file()
    return load_module("cpu")
