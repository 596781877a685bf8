"""The models' numbers are the architectures' own: every field of a preset and its models.toml table that the
model's transformers config declares (layers, heads, head dims, KV rank, MoE and FFN sizes, vocabulary) equals
that config's default, which transformers publishes as the model's (GlmMoeDsaConfig: GLM-5, DeepseekV3Config:
DeepSeek-V3); the config class is the one `model_type` names, as SGLang loads it. The YaRN rope scaling is not
in those defaults: test_indices_and_scale.py pins DeepSeek-V3's sm_scale figure."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sgl

from harness.spec.presets import PRESETS
from harness.tpot.config import load_shape

pytestmark = pytest.mark.sglang

# ModelShape field -> the transformers config attribute of the same number
FIELDS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "kv_lora_rank": "kv_lora_rank",
          "qk_nope_head_dim": "qk_nope_head_dim", "qk_rope_head_dim": "qk_rope_head_dim", "hidden_size": "hidden_size",
          "first_k_dense": "first_k_dense_replace", "q_lora_rank": "q_lora_rank", "v_head_dim": "v_head_dim",
          "n_routed_experts": "n_routed_experts", "num_experts_per_tok": "num_experts_per_tok",
          "n_shared_experts": "n_shared_experts", "moe_intermediate_size": "moe_intermediate_size",
          "intermediate_size": "intermediate_size", "vocab_size": "vocab_size", "n_group": "n_group",
          "topk_group": "topk_group", "routed_scaling_factor": "routed_scaling_factor"}


def mismatches(shape) -> dict[str, tuple]:
    """{field: (harness value, the model_type's transformers default)} where they differ."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(shape.model_type)
    return {f: (getattr(shape, f), getattr(config, attr)) for f, attr in FIELDS.items() if getattr(shape, f) != getattr(config, attr)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_models_numbers_are_the_architectures_own(name):
    sgl.require()
    assert mismatches(load_shape(name)) == {}


def test_a_wrong_number_is_found():  # negative control: GLM-5 with DeepSeek-V3's head count and hidden size
    sgl.require()
    shape = load_shape("glm5-tp8")
    planted = replace(shape, hidden_size=7168, preset=replace(shape.preset, num_heads_total=128))
    assert mismatches(planted) == {"hidden_size": (7168, 6144), "num_heads": (128, 64)}
