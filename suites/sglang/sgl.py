"""Import SGLang (or skip with the reason) and build its real objects on CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

SKIP_REASON = (
    "sglang is not importable: install it with `bash ci/install_sglang_cpu.sh VENV` "
    "(or `pip install -e` your SGLang checkout) and run `python -m pytest suites/sglang -m sglang`"
)


def require():
    """The sglang package, or skip the calling test with the install instructions. Its two modules the suite stands on
    (the memory pools, the FlashInfer MLA backend) are imported here: a missing import-time dependency of either is a
    skip naming it; one of SGLang's own modules missing, or an import that raises anything else (a dependency of
    another version), is a one-line failure."""
    from harness.integrations.sglang import runtime

    for module in (runtime.MEMORY_POOL, runtime.MLA_BACKEND):
        try:  # a failed attempt leaves no partial package behind: every test's reason names the missing module
            runtime.import_module(module)
            continue
        except Exception as exc:  # decided below, outside this block: one line, no chained traceback
            error, missing = exc, getattr(exc, "name", None) or ""
        text = " ".join(str(error).split())
        if not isinstance(error, ImportError):
            pytest.fail(f"{module} does not import: {type(error).__name__}: {text} (its dependencies' versions are not "
                        "ci/sglang-cpu-pins.txt's?)", pytrace=False)
        if missing.startswith("sglang.") and missing != "sglang.srt":
            pytest.fail(f"{module} does not import: {text} (this SGLang is laid out otherwise)", pytrace=False)
        hint = "" if missing in ("", "sglang", "sglang.srt") else "; a dependency: add it to ci/sglang-cpu-pins.txt"
        pytest.skip(f"{SKIP_REASON} ({text}{hint})")
    if not _triton_interpreted():
        pytest.skip("SGLang's Triton kernels need the interpreter on CPU: run `python -m pytest suites/sglang -m sglang` "
                    "in its own process (TRITON_INTERPRET=1 must be set before triton is imported)")
    import sglang

    return sglang


def _triton_interpreted() -> bool:
    import triton

    @triton.jit
    def probe():
        pass

    return type(probe).__name__ == "InterpretedFunction"


# the modules of SGLang's decode path that import its kv-indices kernel (the kernel's own module moves between releases:
# sglang.srt.layers.attention.triton_ops, sglang.kernels.ops.kvcache, sglang.kernels.ops.attention)
KV_INDICES_USERS = ("sglang.srt.mem_cache.kv_index_translator", "sglang.srt.layers.attention.flashinfer_mla_backend")


def kv_indices_kernel():
    """create_flashinfer_kv_indices_triton as the installed SGLang's FlashInfer MLA decode path imports it."""
    import importlib

    for name in KV_INDICES_USERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        if (kernel := getattr(module, "create_flashinfer_kv_indices_triton", None)) is not None:
            return kernel
    pytest.fail(f"none of {', '.join(KV_INDICES_USERS)} imports create_flashinfer_kv_indices_triton: this SGLang builds "
                "kv_indices another way; re-read its decode plan (StepBatch.kv_indices models that kernel)", pytrace=False)


def alloc_decode(seq_lens: torch.Tensor, last_loc: torch.Tensor, fresh: list[int], page_size: int) -> torch.Tensor:
    """The slots SGLang's PagedTokenToKVPoolAllocator.alloc_decode (its public method, whichever kernel it picks on this
    platform) gives a decode step's new tokens: `last_loc` each request's previous last slot, `fresh` the free pages in
    the order it takes them (pages the step leaves untaken follow, so a step's batch never exceeds its free list)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    spare = max(len(seq_lens) - len(fresh), 0)
    pages = fresh + [max(fresh, default=0) + 1 + i for i in range(spare)]
    allocator = PagedTokenToKVPoolAllocator((max(pages, default=0) + 1) * page_size, page_size, torch.float8_e4m3fn, "cpu",
                                            None, need_sort=False)
    allocator.free_pages = torch.tensor(pages, dtype=torch.int64)
    out = allocator.alloc_decode(seq_lens, seq_lens.cpu(), last_loc)
    assert out is not None, "SGLang's allocator found no free page for the step"
    return out


def run_strategies(case_name: str, strategies, **kwargs) -> dict:
    """suites.helpers.run_strategies, each requested strategy required to run: when the installed SGLang cannot run
    here, the test fails with sglang_flashinfer's own verdict (the error SGLang raised), not a KeyError or a claim
    about SGLang's behaviour drawn from a run that never happened."""
    from suites.helpers import run_strategies as run

    return run(case_name, strategies, require=True, **kwargs)


def single_rank():
    """SGLang's parallel context forced to one rank, no decode-context parallelism (the fields the installed SGLang has)."""
    from harness.integrations.sglang import runtime

    return runtime.single_rank()


def layer(layer_id: int, heads: int = 1) -> SimpleNamespace:
    """The RadixAttention fields the MLA pool and backend read."""
    return SimpleNamespace(layer_id=layer_id, tp_q_head_num=heads, tp_k_head_num=1, v_head_dim=512, head_dim=576)


def mla_pool(slots: int, page_size: int, num_layers: int, dsa: bool):
    """A real MLATokenToKVPool (DSATokenToKVPool for a DSA model) with FP8 KV on the CPU."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool

    common = dict(size=slots, page_size=page_size, dtype=torch.float8_e4m3fn, kv_lora_rank=512,
                  qk_rope_head_dim=64, layer_num=num_layers, device="cpu", enable_memory_saver=False)
    with single_rank():
        if dsa:
            return DSATokenToKVPool(**common, index_head_dim=128, kv_cache_dim=576)
        return MLATokenToKVPool(**common)


def write_rows(pool, layer_id: int, slots: torch.Tensor, codes_u8: torch.Tensor) -> None:
    """Store FP8 codes [n, 576] through the real set_mla_kv_buffer, handing it BF16 K as the model does
    (every e4m3 value is exact in BF16, so the pool's cast back to e4m3 restores the codes)."""
    k = codes_u8.view(torch.float8_e4m3fn).to(torch.bfloat16).view(-1, 1, 576)
    with single_rank():
        pool.set_mla_kv_buffer(layer(layer_id), slots.to(torch.int64), k[..., :512], k[..., 512:])


def rope_scaling(preset) -> dict | None:
    """The preset's rope_scaling as the model's HF config.json writes it (DeepSeek-V3: YaRN, factor 40)."""
    if preset.yarn_factor <= 1:
        return None
    return {"type": "yarn", "factor": preset.yarn_factor, "mscale": 1.0, "mscale_all_dim": preset.yarn_mscale_all_dim,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
