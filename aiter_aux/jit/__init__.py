"""The JIT builder and loader of module_moe_mxfp4_aux.

Data flows catalog -> instances (``codegen``) -> rendered sources -> ``build.ninja``
(:mod:`.ninja_file`) -> compiled module (:mod:`.build`) -> loaded module (:mod:`.module`).
:mod:`.spec` is the load path (prebuilt, cache or JIT; one module per backend and process),
:mod:`.paths` finds the sources and the cache, :mod:`.toolchain` picks compiler, flags and
their identity.

Import what you use from its module (``aiter_aux.jit.build.BuildError``,
``aiter_aux.jit.spec.load_module``): this package imports nothing, so the load path of a
cache hit never imports the builder, ninja or jinja2.
"""
