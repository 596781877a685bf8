"""Model/deployment presets and pool scales (all fields overridable from the CLI)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from harness.errors import HarnessError

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
# DSA index-K cache (SGLang's DSATokenToKVPool): one 128-dim FP8 key plus one fp32
# scale per 128-channel block for every token, stored per 64-token page.
INDEX_HEAD_DIM = 128
INDEX_QUANT_BLOCK = 128
DSA_INDEX_K_BYTES = INDEX_HEAD_DIM + INDEX_HEAD_DIM // INDEX_QUANT_BLOCK * 4  # 132 B/token/layer


@dataclass(frozen=True)
class ModelPreset:
    """One tensor-parallel rank of an MLA model: what the decode kernels see."""

    name: str
    num_layers: int
    num_heads_total: int
    tp: int
    qk_nope_head_dim: int
    kv_lora_rank: int = KV_LORA_RANK
    qk_rope_head_dim: int = QK_ROPE_HEAD_DIM
    page_size: int = 1  # tokens per pool page (SGLang: 64 for DSA models, else --page-size, default 1)
    index_k_bytes: int = 0  # DSA index-K cache bytes per token per layer (0: not a DSA model)
    yarn_factor: float = 1.0  # rope_scaling.factor of a YaRN config (1: no scaling)
    yarn_mscale_all_dim: float = 0.0  # rope_scaling.mscale_all_dim

    def __post_init__(self):
        if self.kv_lora_rank != KV_LORA_RANK:  # every strategy, the output contract and FlashInfer's MLA decode are built for it
            raise HarnessError(f"preset {self.name}: kv_lora_rank", f"must be {KV_LORA_RANK} (the width SGLang's MLA decode path, "
                                                                   f"FlashInfer's MLA kernels and every strategy here take), got {self.kv_lora_rank}")

    @property
    def heads_per_rank(self) -> int:
        return self.num_heads_total // self.tp

    @property
    def row_width(self) -> int:
        """Bytes of one FP8 KV row: compressed KV plus RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def yarn_mscale(self) -> float:
        """YaRN attention-magnitude factor (SGLang's yarn_get_mscale)."""
        if self.yarn_factor <= 1:
            return 1.0
        return 0.1 * self.yarn_mscale_all_dim * math.log(self.yarn_factor) + 1.0

    @property
    def sm_scale(self) -> float:
        """Softmax scale as SGLang's MLA models set it: head-dim base times mscale squared."""
        return self.yarn_mscale**2 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)


@dataclass(frozen=True)
class Scale:
    """Pool size and how many layers are materialized."""

    name: str
    slots: int
    num_layers: int | None  # None: the preset's layer count

    def layers_for(self, preset: ModelPreset) -> int:
        return preset.num_layers if self.num_layers is None else self.num_layers


PRESETS = {
    p.name: p
    for p in (
        # GLM-5 is a DSA model: SGLang builds a DSATokenToKVPool with 64-token pages and an index-K cache.
        ModelPreset(
            "glm5-tp8", num_layers=78, num_heads_total=64, tp=8, qk_nope_head_dim=192,
            page_size=64, index_k_bytes=DSA_INDEX_K_BYTES,
        ),
        # DeepSeek-V3's config.json: rope_scaling {type: yarn, factor: 40, mscale_all_dim: 1.0}.
        ModelPreset(
            "deepseek-v3-tp8", num_layers=61, num_heads_total=128, tp=8, qk_nope_head_dim=128,
            yarn_factor=40.0, yarn_mscale_all_dim=1.0,
        ),
    )
}

# prod: GLM-5 on 8x RTX PRO 6000 at --mem-fraction-static 0.92 (495,552 token slots per rank,
# 7,743 pages of 64; SGLang rounds the pool down to whole pages).
# ci: small enough that the CPU suite builds pools and runs every strategy in seconds.
SCALES = {
    s.name: s
    for s in (
        Scale("prod", slots=495_552, num_layers=None),
        Scale("ci", slots=16_384, num_layers=2),
    )
}


def get_preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise HarnessError("--preset", f"unknown preset {name!r}; choose from {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def get_scale(name: str, slots: int | None = None, num_layers: int | None = None) -> Scale:
    if name not in SCALES:
        raise HarnessError("--scale", f"unknown scale {name!r}; choose from {', '.join(sorted(SCALES))}")
    scale = SCALES[name]
    if slots is not None:
        if slots < 1:
            raise HarnessError("--slots", f"must be >= 1, got {slots}")
        scale = replace(scale, slots=slots)
    if num_layers is not None:
        if num_layers < 1:
            raise HarnessError("--layers", f"must be >= 1, got {num_layers}")
        scale = replace(scale, num_layers=num_layers)
    return scale
