"""Roofline: the bytes a strategy must move per decode step and the time that takes at the
device's measured copy bandwidth.

Per layer: the cast or gather (`cast_bytes`: read + write), the attention (`attn_bytes`:
every active KV row once in the strategy's KV dtype, plus queries and outputs) and the KV
write (`write_bytes`: FP8 row, plus the BF16 shadow row for shadow), times the layers.
The floor is bytes / copy_gbps (the environment's device-to-device copy speed, bytes read +
written per second); measured / floor says how far a strategy is from moving its bytes once
at full speed. Rows (last step of the schedule): bytes_moved (B per step), floor_us (µs per
step), floor_ratio (step_ms / floor; its detail also holds attn_us / the attention's floor).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.inputs.cases import Case
from harness.inputs.pool import PoolGeometry
from harness.results.document import Row
from harness.spec.schedule import StepBatch
from harness.strategies import REGISTRY


@dataclass(frozen=True)
class Bytes:
    """Bytes one decode step moves, per layer by part, and over all layers."""

    cast: int
    attn: int
    write: int
    num_layers: int

    @property
    def layer(self) -> int:
        return self.cast + self.attn + self.write

    @property
    def step(self) -> int:
        return self.layer * self.num_layers


def step_bytes(strategy: str, geometry: PoolGeometry, batch: StepBatch, num_heads: int) -> Bytes:
    cls = REGISTRY[strategy]
    return Bytes(cls.cast_bytes(geometry, batch), cls.attn_bytes(geometry, batch, num_heads),
                 cls.write_bytes(geometry, batch), geometry.num_layers)


def floor_us(nbytes: int, copy_gbps: float) -> float:
    """Time to move `nbytes` at the copy bandwidth (GB/s), in µs."""
    return nbytes / (copy_gbps * 1e9) * 1e6


def rows(case: Case, outcome, copy_gbps: float | None) -> list[Row]:
    """bytes_moved per strategy that ran; floor_us and floor_ratio where copy_gbps is known."""
    geometry = case.geometry
    last = case.schedule().steps[-1]
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=outcome.backend)
    out = []
    for r in outcome.results:
        if r.strategy not in REGISTRY or r.verdict.status.value in ("unsupported", "error") or REGISTRY[r.strategy].unmodelled:
            continue
        b = step_bytes(r.strategy, geometry, last, case.preset.heads_per_rank)
        parts = dict(cast_bytes=b.cast, attn_bytes=b.attn, write_bytes=b.write, layers=b.num_layers)
        out.append(Row(strategy=r.strategy, metric="bytes_moved", value=b.step, unit="B", better="lower",
                       detail=parts, **ident))
        if not copy_gbps:
            continue
        floor = floor_us(b.step, copy_gbps)
        out.append(Row(strategy=r.strategy, metric="floor_us", value=floor, unit="us", better="lower",
                       detail=dict(copy_gbps=copy_gbps), **ident))
        step = r.metrics.get("step_ms")
        if step is not None:
            attn = r.metrics.get("attn_us")
            attn_floor = floor_us(b.attn, copy_gbps)
            detail = dict(attn_floor_us=attn_floor, attn_ratio=attn.median / attn_floor if attn else None)
            out.append(Row(strategy=r.strategy, metric="floor_ratio", value=step.median * 1e3 / floor, unit="x",
                           better="lower", detail=detail, **ident))
    return out
