"""Repro bundles: the exact rows, indices and queries one decode step reads, as safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch

from harness.errors import HarnessError
from harness.fsio import write_bytes
from harness.inputs.cases import Case
from harness.inputs.memory import GIB, HEADROOM, free_bytes
from harness.inputs.reference import step_queries
from harness.spec import synth


def export_inputs(case: Case, step: int, layers: list[int] | None, out: Path, repro: str, env: dict) -> Path:
    """Write kv_indptr, kv_indices, and per layer rows_u8 [nnz, 576], q_nope, q_pe; metadata as JSON, with the pool
    the indices address, the command that re-creates the bundle (`repro`) and the environment fingerprint (`env`)."""
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
    check_bundle_memory(case, batch, len(layers))
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
        "slots": str(case.scale.slots),
        "num_layers": str(case.num_layers),
        "page_size": str(case.preset.page_size),
        "sm_scale": repr(case.preset.sm_scale),
        "kv_lora_rank": str(case.preset.kv_lora_rank),
        "generator": synth.GENERATOR_VERSION,
        "scenario": json.dumps(case.scenario.to_dict()),
        "layout": "rows_u8[i] is pool row kv_indices[i] as e4m3 bits; request b reads rows kv_indptr[b]:kv_indptr[b+1]",
        "repro": repro,
        "environment": json.dumps(env),
    }
    return write_bytes(out, safetensors.torch.save(tensors, metadata=meta), "--out")


SERIALIZED_COPIES = 2  # safetensors.torch.save holds each tensor's bytes and then the whole file's, beside the tensors


def check_bundle_memory(case: Case, batch, num_layers: int) -> None:
    """Before anything is made: the bundle (the step's indices, and per layer its rows and queries) and its serialized
    copies must fit host memory, else one line (not a process the kernel kills minutes later, no message, nothing written)."""
    preset = case.preset
    per_layer = len(batch.kv_indices) * preset.row_width + len(batch.request_ids) * preset.heads_per_rank * preset.row_width * 2
    bundle = batch.kv_indptr.nbytes + batch.kv_indices.nbytes + batch.request_ids.nbytes + num_layers * per_layer
    need, free = bundle * (1 + SERIALIZED_COPIES), free_bytes(torch.device("cpu"))
    if need > free * HEADROOM:
        raise HarnessError("--layer", f"step {batch.step}'s bundle ({len(batch.kv_indices):,} rows x {num_layers} layer(s)) is "
                                      f"{bundle / GIB:.2f} GiB, {need / GIB:.2f} GiB of host memory with its safetensors copies, "
                                      f"but {free / GIB:.2f} GiB is free ({HEADROOM:.0%} of it usable): export fewer layers or a smaller scenario")
