"""Kernel-instance code generation for module_moe_mxfp4_aux.

Stages, one module each: ``gen_instances`` (the shape catalog ``SHAPES`` and the CLI),
``instances`` (shape -> instance enumeration and the instance keys), ``render``
(Jinja templates -> source text) and ``writer`` (write-if-different, stale removal).
Imports neither torch nor ``aiter_aux``.
"""
