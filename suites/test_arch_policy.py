"""The arch policy table and its loader (CPU only), and how the FlashInfer backend consults it."""

import pytest
import torch

from harness.backends import flashinfer as fi_backend
from harness.backends.arch_policy import load_policy, select_kernel, support
from harness.backends.base import AttnProblem
from harness.errors import HarnessError

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


@pytest.mark.parametrize(
    "capability, kv_dtype, kernel",
    [
        ((9, 0), BF16, "fa3"),
        ((9, 0), FP8, "fa3"),
        ((8, 0), BF16, "fa2"),
        ((10, 0), BF16, "fa2"),
        ((10, 3), BF16, "fa2"),
        ((12, 0), BF16, "fa2"),
        ((12, 1), BF16, "fa2"),
    ],
)
def test_supported_archs_select_their_preferred_kernel(capability, kv_dtype, kernel):
    assert select_kernel(capability, kv_dtype) == (kernel, None)


def test_sm90_fp8_runs_fa3_then_fa2_with_a_per_tensor_kv_scale():
    found = support((9, 0), FP8)
    assert found.kernels == ("fa3", "fa2")
    assert found.scale_mode == "kv-per-tensor"
    assert support((9, 0), BF16).scale_mode == "default"


@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
def test_sm12x_fp8_is_unsupported_because_xqa_needs_fp8_query_and_128_heads(capability):
    kernel, reason = select_kernel(capability, FP8)
    assert kernel is None
    assert reason.startswith(f"unsupported on SM{capability[0]}{capability[1]}: ")
    assert "XQA" in reason and "FP8 query" in reason and "128 heads" in reason


@pytest.mark.parametrize("capability", [(8, 0), (10, 0), (10, 3)])
def test_fp8_kv_outside_sm90_is_unsupported(capability):
    kernel, reason = select_kernel(capability, FP8)
    assert kernel is None and "only on SM90" in reason


@pytest.mark.parametrize("capability", [(7, 5), (8, 9), (11, 0), (10, 7)])
def test_unlisted_arch_is_reported_unsupported(capability):  # negative control
    for kv_dtype in (BF16, FP8):
        kernel, reason = select_kernel(capability, kv_dtype)
        assert kernel is None
        arch = f"SM{capability[0]}{capability[1]}"
        assert reason == f"unsupported on {arch}: no FlashInfer FA2/FA3 MLA policy for this architecture"


def test_a_kv_dtype_outside_the_contract_is_bad_input():
    with pytest.raises(HarnessError, match="kv_dtype"):
        select_kernel((9, 0), torch.float16)


GOOD = """
[default]
unsupported = "nope"
[arch.x]
capabilities = ["9.0"]
bf16 = { kernels = ["fa2"], scale_mode = "default" }
fp8 = { unsupported = "no fp8" }
"""


def write(tmp_path, text):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_loader_reads_a_custom_table(tmp_path):
    policy = load_policy(write(tmp_path, GOOD))
    assert policy.select_kernel((9, 0), BF16) == ("fa2", None)
    assert policy.select_kernel((9, 0), FP8) == (None, "unsupported on SM90: no fp8")
    assert policy.select_kernel((12, 0), BF16) == (None, "unsupported on SM120: nope")


@pytest.mark.parametrize(
    "broken, where",
    [
        ('kernels = ["fa2"]', "scale_mode"),  # a supported dtype without scale_mode
        ('kernels = ["fa4"], scale_mode = "default"', "kernels"),  # unknown kernel
        ('kernels = [], scale_mode = "default"', "kernels"),  # empty kernel list
        ('kernels = ["fa2"], scale_mode = "default", unsupported = "x"', "exactly one"),
        ('kernels = ["fa2"], scale_mode = "bmm-scalar"', "scale_mode"),
    ],
)
def test_loader_rejects_malformed_entries(tmp_path, broken, where):  # negative controls
    text = GOOD.replace('kernels = ["fa2"], scale_mode = "default"', broken)
    with pytest.raises(HarnessError, match=where):
        load_policy(write(tmp_path, text))


@pytest.mark.parametrize(
    "edit, where",
    [
        (lambda t: t.replace('unsupported = "nope"', ""), "default.unsupported"),
        (lambda t: t.replace('["9.0"]', '["9.0", "9.0"]'), "listed twice"),
        (lambda t: t.replace('["9.0"]', '["sm90"]'), "major.minor"),
        (lambda t: t.replace('["9.0"]', "[]"), "at least one"),
        (lambda t: t + "[[oops", "malformed TOML"),
    ],
)
def test_loader_rejects_malformed_tables(tmp_path, edit, where):  # negative controls
    with pytest.raises(HarnessError, match=where):
        load_policy(write(tmp_path, edit(GOOD)))


def test_backend_module_imports_and_refuses_cpu_without_flashinfer():
    backend = fi_backend.FlashInferBackend("cpu", "fa2")
    assert backend.name == "flashinfer-fa2"
    assert "CUDA" in backend.unsupported_reason(torch.device("cpu"), BF16)
    with pytest.raises(HarnessError, match="kernel"):
        fi_backend.FlashInferBackend("cpu", "xqa")


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend flashinfer imports and the GPU has the given capability."""
    monkeypatch.setattr(fi_backend, "_import_error", lambda: None)

    def set_capability(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    return set_capability


def test_backend_reports_the_policy_reason(fake_gpu):
    cuda = torch.device("cuda")
    fake_gpu((12, 0))
    assert "XQA" in fi_backend.FlashInferBackend(cuda, "fa2").unsupported_reason(cuda, FP8)
    assert fi_backend.FlashInferBackend(cuda, "fa2").unsupported_reason(cuda, BF16) is None
    assert "fa3 is not in the SM120 policy" in fi_backend.FlashInferBackend(cuda, "fa3").unsupported_reason(cuda, BF16)
    fake_gpu((9, 0))
    for kernel in ("fa3", "fa2"):
        assert fi_backend.FlashInferBackend(cuda, kernel).unsupported_reason(cuda, FP8) is None
    fake_gpu((7, 5))
    assert "unsupported on SM75" in fi_backend.FlashInferBackend(cuda, "fa2").unsupported_reason(cuda, BF16)



def test_replan_refuses_eager_plans_and_shape_changes():  # negative controls, no GPU needed
    def problem(heads, nnz):
        return AttnProblem(
            kv_indptr=torch.tensor([0, nnz], dtype=torch.int32),
            kv_indices=torch.arange(nnz, dtype=torch.int32),
            num_heads=heads,
            sm_scale=0.1,
            kv_dtype=BF16,
        )

    backend = fi_backend.FlashInferBackend("cpu", "fa2")
    with pytest.raises(HarnessError, match="only plans made with graph_capacity"):
        backend.replan(fi_backend.FlashInferPlan(None, problem(8, 4)), problem(8, 4))
    graph_plan = fi_backend.FlashInferPlan(None, problem(8, 4), graph_capacity=16)
    with pytest.raises(HarnessError, match="cannot change num_heads"):
        backend.replan(graph_plan, problem(16, 4))
    with pytest.raises(HarnessError, match="exceed capacity 16"):
        backend.replan(graph_plan, problem(8, 17))


TRITON_E4M3 = ("stock_vectorized", "gather_cast", "shadow", "fused_fp8")  # their CUDA kernels decode e4m3 in Triton


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 6), (8, 7)])
def test_triton_e4m3_strategies_are_unsupported_below_sm89(monkeypatch, capability):
    """Triton's e4m3 type (tl.float8e4nv) builds for sm_89+ only: on an A100 (sm_80, whose BF16 FA2 policy lets a run
    start) the Triton strategies say so in an unsupported verdict instead of an error from Triton's compiler."""
    pytest.importorskip("triton", reason="triton is not installed")
    from harness.backends.torch_backend import TorchBackend
    from harness.strategies import REGISTRY

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    backend = TorchBackend(cuda)
    sm = f"sm_{capability[0]}{capability[1]}"
    for name in TRITON_E4M3:
        reason = REGISTRY[name].unsupported_reason(cuda, backend)
        assert reason is not None and "sm_89 or newer" in reason and sm in reason, (name, reason)
    for name in ("stock", "native_fp8"):  # torch's cast and attention: no Triton
        assert REGISTRY[name].unsupported_reason(cuda, backend) is None, name


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_triton_e4m3_strategies_run_from_sm89(monkeypatch, capability):  # twin: the check does not refuse newer GPUs
    pytest.importorskip("triton", reason="triton is not installed")
    from harness.backends.torch_backend import TorchBackend
    from harness.kernels.fused_mla_decode import INTERPRETED
    from harness.strategies import REGISTRY

    if INTERPRETED:
        pytest.skip("under TRITON_INTERPRET=1 fused_fp8 runs on the CPU only")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    for name in TRITON_E4M3:
        assert REGISTRY[name].unsupported_reason(cuda, TorchBackend(cuda)) is None, name


@pytest.mark.parametrize("capability, kernel", [((12, 0), "fa3"), ((10, 0), "fa3"), ((8, 9), "fa2"), ((8, 9), "auto")])
def test_gpu_suites_skip_a_kernel_the_arch_policy_does_not_list(fake_gpu, capability, kernel):
    """The GPU suites parametrized with fa3 and fa2 skip, naming the policy's line, where this GPU's policy does not list
    the kernel (fa3 on an SM120), instead of erroring; where it does, they get the backend (twin)."""
    from suites.gpu import test_gpu_correctness as gpu

    fake_gpu(capability)
    cuda = torch.device("cuda", 0)
    with pytest.raises(pytest.skip.Exception, match=f"does not run on SM{capability[0]}{capability[1]}|unsupported on SM"):
        gpu._supported(cuda, kernel)
    fake_gpu((9, 0))
    assert "stock" in gpu._supported(cuda, kernel)


def test_a_gpu_without_a_flashinfer_policy_is_told_the_torch_backend(fake_gpu):
    """An L40S (SM89) with the default backend: one line, the policy's reason and the backend that runs there."""
    from harness.backends import make_backend
    from harness.errors import HarnessError

    fake_gpu((8, 9))
    with pytest.raises(HarnessError, match=r"unsupported on SM89: no FlashInfer .* \(--backend torch runs what it can"):
        make_backend("auto", torch.device("cuda", 0))
    fake_gpu((9, 0))  # twin: a GPU the policy lists gets its backend
    assert make_backend("auto", torch.device("cuda", 0)).name.startswith("flashinfer")
