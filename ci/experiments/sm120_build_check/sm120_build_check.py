"""Prove FlashInfer's FA2 batch-MLA module compiles for SM120 without an SM120 GPU.

Builds (never loads) the exact JIT module the SM120 decode path uses: FA2,
BF16 query/KV/output, int32 indices, head_dim_ckv 512, head_dim_kpe 64, no
profiler. Only nvcc, ninja and a C++ compiler are needed; no GPU and no CUDA
driver are touched. The target comes from FLASHINFER_CUDA_ARCH_LIST, which
flashinfer reads at import time, so it is set before the import. Without
--workdir a fresh JIT workspace is used, so the build is always cold.

    python -m ci.experiments.sm120_build_check [--arch "12.0a"] [--workdir DIR] [--verbose]

Prints the gencode flags, the SM numbers of the cubins inside the produced .so
(read from its fatbin headers) and its path; exits 0 on success, 1 with one
line on failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def fail(message: str) -> None:
    print(f"sm120_build_check: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def ensure_ninja() -> None:
    """flashinfer runs `ninja` from PATH; fall back to the ninja wheel's own bin dir."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        fail("ninja is not on PATH and the ninja package is not installed")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def first_diagnostic(log: str) -> str:
    """The first compiler/linker complaint in a ninja log, else its first line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    pattern = re.compile(r"error|cannot find|undefined reference|fatal", re.IGNORECASE)
    hits = [line for line in lines if pattern.search(line) and not line.startswith("collect2")]
    return (hits or lines or ["(no output)"])[0]


def gencode_flags(ninja_file: Path) -> list[str]:
    return sorted(set(re.findall(r"-gencode=\S+", ninja_file.read_text())))


def cubin_archs(library: Path) -> list[int]:
    """SM numbers of the cubin (ELF) entries in the library's fatbins.

    Fatbin layout as emitted by nvcc 12/13: a 16-byte header (magic 0xBA55ED50,
    u16 version, u16 header size, u64 payload size), then entries, each a header
    (u16 kind: 1 PTX / 2 ELF, u16, u32 header size, u64 payload size, ..., u32
    SM number at offset 28) and its payload. Only the headers are read.
    """
    data = library.read_bytes()
    archs = []
    start = data.find(FATBIN_MAGIC)
    while start >= 0:
        _, header_size, payload_size = struct.unpack_from("<HHQ", data, start + 4)
        entry, end = start + header_size, start + header_size + payload_size
        while entry < end:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", data, entry)
            if entry_header == 0:
                break
            if kind == 2:
                archs.append(struct.unpack_from("<I", data, entry + 28)[0])
            entry += entry_header + entry_size
        start = data.find(FATBIN_MAGIC, end)
    return archs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="12.0a", help="FLASHINFER_CUDA_ARCH_LIST (default 12.0a)")
    parser.add_argument("--workdir", help="JIT workspace base (default: a fresh temp dir)")
    parser.add_argument("--verbose", action="store_true", help="stream nvcc/ninja output")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fi-sm120-")).resolve()
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(workdir)
    ensure_ninja()

    try:
        import torch
        from flashinfer.jit import gen_batch_mla_module
        from flashinfer.jit.cpp_ext import get_cuda_path, get_cuda_version
    except Exception as error:  # any import failure is the one line we report
        fail(f"cannot import flashinfer.jit: {type(error).__name__}: {error}")

    bf16 = torch.bfloat16
    try:
        spec = gen_batch_mla_module("fa2", bf16, bf16, bf16, torch.int32, 512, 64, False)
    except Exception as error:
        fail(f"gen_batch_mla_module: {type(error).__name__}: {error}")

    print(f"nvcc: {get_cuda_path()}/bin/nvcc (CUDA {get_cuda_version()})")
    print(f"module: {spec.name}")
    spec.write_ninja()
    flags = gencode_flags(spec.ninja_path)
    print(f"gencode: {' '.join(flags)}")
    if not flags or not all("sm_12" in flag for flag in flags):
        fail(f"FLASHINFER_CUDA_ARCH_LIST={args.arch!r} does not target SM12x only: {flags}")
    started = time.perf_counter()
    try:
        spec.build(verbose=args.verbose, need_lock=True)
    except Exception as error:
        fail(f"build of {spec.name} failed: {first_diagnostic(str(error))} (rerun with --verbose)")
    library = spec.jit_library_path
    if not library.is_file():
        fail(f"ninja succeeded but {library} is missing")
    archs = cubin_archs(library)
    print(f"cubins: {', '.join(f'sm_{arch}' for arch in archs)}")
    if not archs or any(arch // 10 != 12 for arch in archs):
        fail(f"{library.name} holds cubins for {archs}, not SM12x only")
    print(f"built in {time.perf_counter() - started:.1f} s")
    print(f"so: {library} ({library.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
