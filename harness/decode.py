"""The decode loop: per step plan once, then per layer write the new token, prepare KV, attend."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.faults import NAN_CODE, Fault
from harness.pool import KVPool, kv_rows
from harness.presets import ModelPreset
from harness.reference import step_queries
from harness.schedule import Schedule, StepBatch
from harness.strategies import Strategy

Outputs = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, layer) -> (out, lse) on CPU


@dataclass
class StepData:
    """Everything the steps feed the kernels, made once on the run device and shared by strategies."""

    queries: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, layer) -> (q_nope, q_pe)
    new_rows: dict[tuple[int, int], torch.Tensor]  # (step, layer) -> uint8 [B, 576]
    write_slots: dict[int, torch.Tensor]  # step -> int64 [B]


def make_step_data(preset: ModelPreset, schedule: Schedule, pool: KVPool, faults=frozenset()) -> StepData:
    dev, seed = pool.device, schedule.scenario.seed
    queries, new_rows, slots = {}, {}, {}
    for batch in schedule.steps:
        slots[batch.step] = torch.as_tensor(batch.write_slots, dtype=torch.int64).to(dev)
        for layer in range(pool.geometry.num_layers):
            q_nope, q_pe = step_queries(preset, seed, batch, layer)
            queries[(batch.step, layer)] = (q_nope.to(dev), q_pe.to(dev))
            rows = kv_rows(seed, layer, batch.write_slots, batch.write_gen, preset.row_width, dev).to(dev)
            if Fault.NAN_IN_POOL in faults and batch.step == 0:
                rows[0, 0] = NAN_CODE
            new_rows[(batch.step, layer)] = rows
    return StepData(queries, new_rows, slots)


class DecodeSession:
    """A strategy set up over the pool for one schedule; leaving it undoes the pool writes."""

    def __init__(self, strategy: Strategy, schedule: Schedule, data: StepData):
        self.strategy, self.schedule, self.data = strategy, schedule, data

    def __enter__(self) -> "DecodeSession":
        self.strategy.setup(self.schedule)
        return self

    def __exit__(self, *exc) -> None:
        self.strategy.teardown()
        self.strategy.pool.restore(self.schedule.written_slots)

    def layers(self, plan, batch: StepBatch, record_layers=()) -> Outputs:
        """The per-layer loop of one step (write, prepare KV, attend) under an existing plan."""
        s, d = self.strategy, self.data
        outputs: Outputs = {}
        for layer in range(s.pool.geometry.num_layers):
            s.write(batch, layer, d.write_slots[batch.step], d.new_rows[(batch.step, layer)])
            out, lse = s.attend(plan, *d.queries[(batch.step, layer)], s.prepare_kv(layer))
            if layer in record_layers:
                outputs[(batch.step, layer)] = (out.cpu(), lse.float().cpu())
        return outputs

    def step(self, batch: StepBatch, record_layers=()) -> Outputs:
        """One decode step over every layer; (out, lse) of `record_layers` copied to the CPU."""
        return self.layers(self.strategy.begin_step(batch), batch, record_layers)

    def capture_step(self, batch: StepBatch):
        """(plan, graph): the step's layer loop captured in one CUDA graph over a re-plannable plan."""
        plan = self.strategy.begin_step(batch, graph_capacity=len(batch.kv_indices))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.layers(plan, batch)  # warm-up: compile and allocate outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.layers(plan, batch)
        return plan, graph

    def run_all(self, record_layers, progress=None) -> Outputs:
        outputs: Outputs = {}
        for batch in self.schedule.steps:
            outputs.update(self.step(batch, set(record_layers)))
            if progress is not None:
                progress()
        return outputs
