"""Repro bundles: the exact rows, indices and queries one decode step reads, as safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch

from harness.errors import HarnessError
from harness.fsio import write_bytes
from harness.inputs.cases import Case
from harness.inputs.reference import step_queries
from harness.spec import synth


def export_inputs(case: Case, step: int, layers: list[int] | None, out: Path) -> Path:
    """Write kv_indptr, kv_indices, and per layer rows_u8 [nnz, 576], q_nope, q_pe; metadata as JSON."""
    schedule = case.schedule()
    if not 0 <= step < len(schedule.steps):
        raise HarnessError("--step", f"must be in [0, {len(schedule.steps) - 1}], got {step}")
    layers = list(dict.fromkeys(layers or [0]))  # a layer named twice is exported once
    for layer in layers:
        if not 0 <= layer < case.num_layers:
            raise HarnessError("--layer", f"must be in [0, {case.num_layers - 1}], got {layer}")
    if out.suffix != ".safetensors":
        raise HarnessError("--out", f"must end in .safetensors, got {out.name!r}")
    batch = schedule.steps[step]
    tensors = {
        "kv_indptr": torch.from_numpy(batch.kv_indptr.copy()),
        "kv_indices": torch.from_numpy(batch.kv_indices.copy()),
        "request_ids": torch.from_numpy(batch.request_ids.copy()),
    }
    for layer in layers:
        q_nope, q_pe = step_queries(case.preset, case.scenario.seed, batch, layer)
        tensors[f"l{layer}.q_nope"] = q_nope
        tensors[f"l{layer}.q_pe"] = q_pe
        tensors[f"l{layer}.rows_u8"] = synth.kv_codes(case.scenario.seed, layer, batch.kv_indices, batch.index_gens, case.preset.row_width)
    meta = {
        "case": case.name,
        "step": str(step),
        "layers": json.dumps(layers),
        "sm_scale": repr(case.preset.sm_scale),
        "kv_lora_rank": str(case.preset.kv_lora_rank),
        "generator": synth.GENERATOR_VERSION,
        "scenario": json.dumps(case.scenario.to_dict()),
        "layout": "rows_u8[i] is pool row kv_indices[i] as e4m3 bits; request b reads rows kv_indptr[b]:kv_indptr[b+1]",
    }
    return write_bytes(out, safetensors.torch.save(tensors, metadata=meta), "--out")
