"""Ahead-of-time compilation of every kernel here for a CUDA target, without a GPU.

Evidence that the kernels build for an architecture we cannot run on (sm_120,
RTX PRO 6000 Blackwell): each kernel is compiled through triton.compile with the
launch configuration and argument specialization (16-byte aligned pointers and
row strides) that the wrappers use, and must yield a non-empty cubin.

The build list is not kept here: every module of harness.kernels that declares
`aot_specs(width)` (its launched variants) and `AOT_STAGE` is compiled, in pipeline
order (STAGES), so a strategy's new kernel module is built by declaring them.
"""

from __future__ import annotations

import importlib
import pkgutil

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import harness.kernels
from harness.kernels import cast

ROW_WIDTH = 576
STAGES = ("inputs", "prepare_kv", "write", "attend")  # the pool's, the casts and gathers, the KV writes, attention


def kernel_modules() -> list:
    """The kernel modules that declare AOT variants, by (stage, name)."""
    modules = [importlib.import_module(f"harness.kernels.{m.name}") for m in pkgutil.iter_modules(harness.kernels.__path__)
               if m.name != "sm120_compile"]
    declared = [m for m in modules if hasattr(m, "aot_specs")]
    return sorted(declared, key=lambda m: (STAGES.index(m.AOT_STAGE), m.__name__))


def _specs(width: int):
    """(label, kernel, signature, constexprs, num_warps) for every launched variant."""
    return [spec for module in kernel_modules() for spec in module.aot_specs(width)]


def _source(kernel, signature, constexprs):
    """An ASTSource with arguments in kernel order; pointers, strides and the cast's element
    count marked 16-divisible, as the JIT specializes them for 576-channel pools."""
    names = kernel.arg_names
    sig = {k: signature.get(k, "constexpr") for k in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(names)
               if sig[k].startswith("*") or k.endswith("_stride") or kernel is cast.cast_kernel and k == "n"}
    return ASTSource(kernel, signature=sig, constexprs=constexprs, attrs=aligned)


def compile_all_for(capability: int, width: int = ROW_WIDTH) -> list[str]:
    """Compile every kernel variant for sm_<capability>; return their labels."""
    target = GPUTarget("cuda", capability, 32)
    labels = []
    for label, kernel, signature, constexprs, num_warps in _specs(width):
        compiled = triton.compile(_source(kernel, signature, constexprs), target=target,
                                  options={"num_warps": num_warps})
        if not compiled.asm.get("cubin"):
            raise RuntimeError(f"{label}: empty cubin for sm_{capability}")
        labels.append(label)
    return labels
