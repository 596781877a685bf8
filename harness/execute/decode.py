"""The decode loop: per step plan once, then per layer write the new token, prepare KV, attend.

Every attend of every strategy goes through `attend` here, which asserts the attention boundary's
dtype contract (harness.backends.contract) after the strategy's own `attend`, whatever that does."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.backends.contract import check_boundary
from harness.inputs.pool import KVPool, kv_rows
from harness.inputs.reference import step_queries
from harness.spec.buckets import bucket_capacities, bucket_for, pad_batch
from harness.spec.faults import NAN_CODE, Fault
from harness.spec.presets import ModelPreset
from harness.spec.schedule import Schedule, StepBatch
from harness.strategies import Strategy

Outputs = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, layer) -> (out, lse) on CPU


@dataclass
class StepInputs:
    """What one step's layer loop reads, stacked over layers (one copy moves a whole step)."""

    slots: torch.Tensor  # int64 [B]: where each request's new token goes
    q_nope: torch.Tensor  # bf16 [L, B, H, 512]
    q_pe: torch.Tensor  # bf16 [L, B, H, 64]
    rows: torch.Tensor  # uint8 [L, B, 576]: the new tokens' FP8 bytes


@dataclass
class StepData:
    """Everything the steps feed the kernels, made once on the run device and shared by strategies."""

    steps: dict[int, StepInputs]

    @property
    def queries(self) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
        return {(t, layer): (s.q_nope[layer], s.q_pe[layer]) for t, s in self.steps.items() for layer in range(len(s.rows))}

    @property
    def new_rows(self) -> dict[tuple[int, int], torch.Tensor]:
        return {(t, layer): s.rows[layer] for t, s in self.steps.items() for layer in range(len(s.rows))}


def step_data_bytes(preset: ModelPreset, schedule: Schedule, num_layers: int) -> int:
    """What make_step_data holds on the run device: each step's requests' queries and new rows in every layer, and slots."""
    per_request = num_layers * (preset.heads_per_rank * preset.row_width * 2 + preset.row_width) + 8
    return per_request * sum(batch.batch_size for batch in schedule.steps)


def outputs_bytes(preset: ModelPreset, schedule: Schedule, record_layers) -> int:
    """What a run's Outputs hold on the CPU: bf16 out [B, H, 512] and fp32 LSE [B, H] of every step's recorded layers."""
    per_request = len(record_layers) * preset.heads_per_rank * (preset.kv_lora_rank * 2 + 4)
    return per_request * sum(batch.batch_size for batch in schedule.steps)


def make_step_data(preset: ModelPreset, schedule: Schedule, pool: KVPool, faults=frozenset()) -> StepData:
    dev, seed, layers = pool.device, schedule.scenario.seed, pool.geometry.num_layers
    steps = {}
    for batch in schedule.steps:
        heads, rank = preset.heads_per_rank, preset.kv_lora_rank
        q_nope = torch.empty((layers, batch.batch_size, heads, rank), dtype=torch.bfloat16, device=dev)
        q_pe = torch.empty((layers, batch.batch_size, heads, preset.row_width - rank), dtype=torch.bfloat16, device=dev)
        for layer in range(layers):  # one layer's queries at a time on the host: the step's are made in place
            qn, qp = step_queries(preset, seed, batch, layer)
            q_nope[layer], q_pe[layer] = qn, qp
        rows = torch.stack([kv_rows(seed, layer, batch.write_slots, batch.write_gen, preset.row_width, dev).to(dev) for layer in range(layers)])
        if Fault.NAN_IN_POOL in faults and batch.step == 0:
            rows[:, 0, 0] = NAN_CODE
        steps[batch.step] = StepInputs(slots=torch.as_tensor(batch.write_slots, dtype=torch.int64).to(dev), q_nope=q_nope, q_pe=q_pe, rows=rows)
    return StepData(steps)


def attend(strategy: Strategy, plan, q_nope: torch.Tensor, q_pe: torch.Tensor, kv) -> tuple[torch.Tensor, torch.Tensor]:
    """`strategy.attend`, then the dtype contract on what it was handed and returned: queries bf16,
    KV of its declared kv_dtype, output bf16 [B, H, 512], LSE fp32 [B, H] (ContractViolation)."""
    out, lse = strategy.attend(plan, q_nope, q_pe, kv)
    check_boundary(strategy.name, strategy.kv_dtype, q_nope, *kv, out, lse)
    return out, lse


class DecodeSession:
    """A strategy set up over the pool for one schedule; leaving it undoes the pool writes and hands
    the memory the strategy cached back to the driver, so that what the next session allocates (its
    buffers, the timing's cold-L2 clones) does not depend on which strategy ran before it: a freed
    41 GiB shadow buffer left in torch's cache made fused_fp8's attn_us at b32-l4096 read 30.2 us
    instead of 28.6 (docs/h200/fused/run19/allocator_order.json)."""

    def __init__(self, strategy: Strategy, schedule: Schedule, data: StepData):
        self.strategy, self.schedule, self.data = strategy, schedule, data
        self._graphs: dict[int, BucketGraph] = {}

    def __enter__(self) -> "DecodeSession":
        self.strategy.setup(self.schedule)
        return self

    def __exit__(self, *exc) -> None:
        self._graphs.clear()
        self.strategy.teardown()
        self.strategy.pool.restore(self.schedule.written_slots)
        if self.strategy.device.type == "cuda":
            torch.cuda.synchronize(self.strategy.device)
            torch.cuda.empty_cache()

    def layers(self, plan, batch: StepBatch, record_layers=(), inputs: StepInputs | None = None, to_cpu: bool = True) -> Outputs:
        """The per-layer loop of one step (write, prepare KV, attend) under an existing plan;
        (out, lse) of `record_layers` copied to the CPU (`to_cpu=False`: the device tensors)."""
        s, d = self.strategy, inputs or self.data.steps[batch.step]
        outputs: Outputs = {}
        for layer in range(s.pool.geometry.num_layers):
            s.write(batch, layer, d.slots, d.rows[layer])
            out, lse = attend(s, plan, d.q_nope[layer], d.q_pe[layer], s.prepare_kv(layer))
            if layer in record_layers:
                outputs[(batch.step, layer)] = (out.cpu(), lse.float().cpu()) if to_cpu else (out, lse)
        return outputs

    def step(self, batch: StepBatch, record_layers=()) -> Outputs:
        """One decode step over every layer; (out, lse) of `record_layers` copied to the CPU."""
        return self.layers(self.strategy.begin_step(batch), batch, record_layers)

    def run_all(self, record_layers, progress=None) -> Outputs:
        outputs: Outputs = {}
        for batch in self.schedule.steps:
            outputs.update(self.step(batch, set(record_layers)))
            if progress is not None:
                progress()
        return outputs

    def bucket_graph(self, batch: StepBatch, record_layers=()) -> "BucketGraph":
        """The graph of `batch`'s batch-size bucket, captured on first use (eager on the CPU)."""
        bucket = bucket_for(batch.batch_size)
        if bucket not in self._graphs:
            self._graphs[bucket] = BucketGraph(self, bucket, bucket_capacities(self.schedule)[bucket], record_layers)
        return self._graphs[bucket]


def padded_inputs(data: StepInputs, size: int) -> StepInputs:
    """Zero-filled inputs for `size` requests (padding writes zeros into the all-zero row 0)."""
    n_layers, _, heads, _ = data.q_nope.shape
    return StepInputs(
        slots=torch.zeros(size, dtype=data.slots.dtype, device=data.slots.device),
        q_nope=data.q_nope.new_zeros((n_layers, size, heads, data.q_nope.shape[-1])),
        q_pe=data.q_pe.new_zeros((n_layers, size, heads, data.q_pe.shape[-1])),
        rows=data.rows.new_zeros((n_layers, size, data.rows.shape[-1])),
    )


class BucketGraph:
    """One CUDA graph of the whole layer loop for a batch-size bucket, replayed for every step that
    fits it: `load(batch)` copies the step's inputs into the captured buffers and re-plans in
    place (host work: SGLang's replay preparation), `replay()` launches the graph (device work).
    On the CPU nothing is captured: the same padded buffers run through the eager loop, so the
    bucket, padding and capacity logic is testable there."""

    def __init__(self, session: DecodeSession, bucket: int, capacity: int, record_layers=()):
        s, self.session, self.bucket, self.capacity = session.strategy, session, bucket, capacity
        self.record_layers = frozenset(record_layers)
        first = next(b for b in session.schedule.steps if bucket_for(b.batch_size) == bucket)
        self.batch = pad_batch(first, bucket)
        self.inputs = padded_inputs(session.data.steps[first.step], bucket)
        self._copy_inputs(first)
        s.use_graph_capacity(capacity)
        self.plan = s.begin_step(self.batch, graph_capacity=capacity)
        self.graph = None
        if s.device.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                session.layers(self.plan, self.batch, inputs=self.inputs)  # warm-up: compile and allocate outside the capture
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # outputs of record_layers stay readable after each replay
                self.outputs = session.layers(self.plan, self.batch, self.record_layers, self.inputs, to_cpu=False)

    def _copy_inputs(self, batch: StepBatch) -> None:
        src, dst, n = self.session.data.steps[batch.step], self.inputs, batch.batch_size
        dst.slots[:n].copy_(src.slots, non_blocking=True)
        dst.q_nope[:, :n].copy_(src.q_nope, non_blocking=True)
        dst.q_pe[:, :n].copy_(src.q_pe, non_blocking=True)
        dst.rows[:, :n].copy_(src.rows, non_blocking=True)
        # padding lanes write zeros into row 0 (pad_batch), not the rows of an earlier, larger step of the bucket
        # into its slots, which a finished request freed and another request's new token may now hold
        dst.slots[n:].zero_()
        dst.rows[:, n:].zero_()

    def load(self, batch: StepBatch) -> None:
        """Point the graph at `batch` (same bucket): its inputs, its kv_indices, its plan."""
        if bucket_for(batch.batch_size) != self.bucket:
            raise ValueError(f"a batch of {batch.batch_size} belongs to bucket {bucket_for(batch.batch_size)}, not {self.bucket}")
        self._copy_inputs(batch)
        self.batch = pad_batch(batch, self.bucket)
        if self.graph is None:
            self.plan = self.session.strategy.begin_step(self.batch, graph_capacity=self.capacity)
        else:
            self.session.strategy.replan_step(self.plan, self.batch)

    def replay(self) -> Outputs:
        """Run the loaded step; the outputs of the record layers (padding rows included), keyed by
        the step loaded (on CUDA they are copied out only when record layers were asked for)."""
        if self.graph is None:
            return self.session.layers(self.plan, self.batch, self.record_layers, self.inputs)
        self.graph.replay()
        return {(self.batch.step, layer): (out.cpu(), lse.float().cpu()) for (_, layer), (out, lse) in self.outputs.items()}
