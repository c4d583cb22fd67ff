"""Kernel-instance code generation for module_moe_mxfp4_aux.

Stages, one module each: ``catalog`` (the shape catalog ``SHAPES`` and its rules),
``instances`` (shape -> instance enumeration and the instance keys), ``render``
(Jinja templates -> source text), ``writer`` (write-if-different, stale removal) and
``gen_instances`` (generation and its CLI).  Imports neither torch nor ``aiter_aux``; only
``render`` (so ``gen_instances``) imports jinja2.
"""
