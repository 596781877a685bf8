"""NVRTC through ctypes: CUDA C++ source to a cubin for any sm_XX, with a GPU or without one.

The library is the one a CUDA torch loads, else the `nvidia-cuda-nvrtc` wheel's (the CPU CI builds
the CUDA kernels with it: `pip install nvidia-cuda-nvrtc`), else the system's. No CUDA toolkit and
no headers are needed: the sources compiled here include none.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_SPILLS = re.compile(r"(?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (?P<registers>\d+) registers")


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel (`ptxas_info=True`)."""

    registers: int
    spill_stores: int
    spill_loads: int


@dataclass(frozen=True)
class Build:
    cubin: bytes
    lowered: dict[str, str]  # name expression (e.g. a template instance) -> its lowered (mangled) name
    resources: dict[str, Resources]  # lowered name -> ptxas's report (empty without ptxas_info)


def wheel_files(pattern: str) -> list[Path]:
    """The files of the installed NVIDIA CUDA wheels (under the `nvidia` namespace package: nvidia/cu13/lib,
    nvidia/cuda_nvrtc/lib, nvidia/cu13/bin, ...) that match the glob `pattern`, relative to that package."""
    spec = importlib.util.find_spec("nvidia")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return [p for root in roots for p in root.glob(pattern)]


def _wheel_libraries() -> list[Path]:
    """libnvrtc.so.N of the installed nvidia-cuda-nvrtc wheels (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), newest first."""
    found = [p for p in wheel_files("*/lib/libnvrtc.so.*") if p.name.split(".so.")[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split(".so.")[1]), reverse=True)


@functools.cache
def library() -> ctypes.CDLL:
    import torch

    if torch.version.cuda:
        from torch.cuda._utils import _get_nvrtc_library

        return _get_nvrtc_library()  # the NVRTC of torch's own CUDA
    for candidate in (*map(str, _wheel_libraries()), "libnvrtc.so"):
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    raise HarnessError("nvrtc", "no NVRTC library: a CUDA torch, `pip install nvidia-cuda-nvrtc` or a CUDA toolkit provides one")


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC {what}: {lib.nvrtcGetErrorString(code).decode()}") from None


def _log(lib: ctypes.CDLL, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def resources(log: str) -> dict[str, Resources]:
    """Per entry function of a `--ptxas-options=-v` log: registers and spill bytes."""
    out, name, spills = {}, None, (0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name, spills = m["name"], (0, 0)
        elif name and (m := _SPILLS.search(line)):
            spills = (int(m["stores"]), int(m["loads"]))
        elif name and (m := _REGISTERS.search(line)):
            out[name] = Resources(int(m["registers"]), *spills)
            name = None
    return out


def build(source: str, names: list[str], arch: str, options: tuple[str, ...] = (), filename: str = "kernel.cu",
            ptxas_info: bool = False) -> Build:
    """`source` compiled for sm_<arch> (e.g. "90", "120") with each of `names` (kernel names or template
    instances) instantiated; a compile error raises RuntimeError with NVRTC's log."""
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None), "create")
    try:
        for name in names:
            _check(lib, lib.nvrtcAddNameExpression(prog, name.encode()), f"name {name}")
        flags = [f"--gpu-architecture=sm_{arch}", *options, *(("--ptxas-options=-v",) if ptxas_info else ())]
        array = (ctypes.c_char_p * len(flags))(*(f.encode() for f in flags))
        if lib.nvrtcCompileProgram(prog, len(flags), array):
            raise RuntimeError(f"{filename} does not compile for sm_{arch}:\n{_log(lib, prog)}")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        lowered = {}
        for name in names:
            out = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)), f"lowered name of {name}")
            lowered[name] = out.value.decode()
        return Build(cubin.raw, lowered, resources(_log(lib, prog)) if ptxas_info else {})
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
