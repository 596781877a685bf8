"""The CUDA fused kernel builds on the CPU CI: NVRTC (harness.kernels.nvrtc, from the nvidia-cuda-nvrtc
wheel) compiles every instance fused_fp8 can launch, and the split merge, for sm_89, sm_90, sm_100 (B200) and
sm_120 (RTX PRO 6000), with no GPU; ptxas's spills are pinned, so a change that makes an instance spill
fails here before a GPU runs it."""

import pytest

from harness.errors import HarnessError
from harness.kernels import fused_mla_cuda, nvrtc

ARCHS = (f"{fused_mla_cuda.MIN_ARCH[0]}{fused_mla_cuda.MIN_ARCH[1]}", "90", "100", "120")
INSTANCES = [i.name for i in fused_mla_cuda.instances()] + [fused_mla_cuda.MERGE_KERNEL]
# (arch, instance) that spill with NVRTC 13.5: none (16 heads, 2 stages, 8 warps, held to 128 registers by
# __launch_bounds__(256, 2), spilled 4 bytes on sm_90 until its row gathers became per-row bulk copies)
SPILLING: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def nvrtc_library():
    try:
        return nvrtc.library()
    except HarnessError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_instance_builds_and_spills_only_where_pinned(nvrtc_library, arch):
    built = nvrtc.build(fused_mla_cuda.SOURCE.read_text(), INSTANCES, arch, fused_mla_cuda.OPTIONS, ptxas_info=True)
    assert len(built.cubin) > 100_000 and set(built.lowered) == set(INSTANCES)
    found = {name: built.resources[built.lowered[name]] for name in INSTANCES}
    assert all(r.registers > 0 for r in found.values()), found
    spilling = {(arch, name) for name, r in found.items() if r.spill_stores or r.spill_loads}
    assert spilling == {s for s in SPILLING if s[0] == arch}, {name: found[name] for _, name in spilling}


def test_the_launch_path_compiles_without_a_gpu(nvrtc_library):
    cubin, lowered = fused_mla_cuda.compile_cubin(fused_mla_cuda.Instance(8, 2, 8), "120")
    assert len(cubin) > 10_000 and lowered.startswith("_Z16fused_mla_decodeILi8ELi2ELi8ELb0E")
    cubin, lowered = fused_mla_cuda.compile_merge_cubin("90")
    assert len(cubin) > 1_000 and "fused_mla_merge" in lowered


def test_a_compile_error_is_reported_with_nvrtcs_log(nvrtc_library):  # the negative control of the builds above
    with pytest.raises(RuntimeError, match=r"(?s)broken\.cu does not compile for sm_90:.*undeclared_name"):
        nvrtc.build("__global__ void k() { undeclared_name = 1; }", ["k"], "90", filename="broken.cu")


def test_ptxas_reports_are_read_per_entry_function():
    log = """ptxas info    : Compiling entry function '_Z1av' for 'sm_90'
ptxas info    : Function properties for _Z1av
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers
ptxas info    : Function properties for helper
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90'
ptxas info    : Function properties for _Z1bv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 56 registers, used 0 barriers
"""
    assert nvrtc.resources(log) == {"_Z1av": nvrtc.Resources(128, 4, 8), "_Z1bv": nvrtc.Resources(56, 0, 0)}
