"""aiter-aux: the auxiliary kernels of the MXFP4 (a4w4) MoE path, JIT-specialised per
model shape.  Importing this package loads no compiled module: the module is built or
loaded on the first op call (:mod:`aiter_aux.jit`)."""

__version__ = "0.1.0"
