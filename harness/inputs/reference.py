"""float64 absorbed-MLA decode oracle over only the rows a step reads.

For request b and head h: logits_t = sm_scale * (q_nope . ckv_t + q_pe . kpe_t),
out = softmax(logits) @ ckv, lse = logsumexp(logits) (natural log).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.spec import synth
from harness.spec.presets import ModelPreset
from harness.spec.schedule import StepBatch


@dataclass(frozen=True)
class StepInputs:
    """What one (step, layer) reads, for a subset of the batch's requests."""

    positions: np.ndarray  # positions of the requests within the step's batch
    q_nope: torch.Tensor  # bf16 [R, H, 512]
    q_pe: torch.Tensor  # bf16 [R, H, 64]
    rows: list[torch.Tensor]  # per request uint8 [len, 576], in kv_indices order


def step_queries(preset: ModelPreset, seed: int, batch: StepBatch, layer: int, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_nope, q_pe) bf16 of the step's requests at `positions` (default: every one), on the CPU."""
    request_ids = batch.request_ids if positions is None else batch.request_ids[positions]
    q = synth.queries(seed, batch.step, layer, request_ids, preset.heads_per_rank, preset.row_width)
    return q[..., : preset.kv_lora_rank].contiguous(), q[..., preset.kv_lora_rank :].contiguous()


def step_inputs(preset: ModelPreset, seed: int, batch: StepBatch, layer: int, positions) -> StepInputs:
    positions = np.asarray(positions, dtype=np.int64)
    q_nope, q_pe = step_queries(preset, seed, batch, layer, positions)  # the checked requests' only: a query is a function of its request
    rows = []
    for i in positions:
        sl = batch.rows_of(int(i))
        rows.append(synth.kv_codes(seed, layer, batch.kv_indices[sl], batch.index_gens[sl], preset.row_width))
    return StepInputs(positions, q_nope, q_pe, rows)


def mla_decode_f64(inputs: StepInputs, kv_lora_rank: int, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out float64 [R, H, 512], lse float64 [R, H]) from dequantized rows."""
    outs, lses = [], []
    for i, rows in enumerate(inputs.rows):
        kv = rows.view(torch.float8_e4m3fn).to(torch.float64)
        ckv, kpe = kv[:, :kv_lora_rank], kv[:, kv_lora_rank:]
        logits = (inputs.q_nope[i].double() @ ckv.T + inputs.q_pe[i].double() @ kpe.T) * sm_scale
        lse = torch.logsumexp(logits, dim=-1)
        outs.append(torch.exp(logits - lse[:, None]) @ ckv)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)
