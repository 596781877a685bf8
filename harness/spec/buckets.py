"""CUDA-graph buckets the way SGLang's decode runner uses them (plain data, testable on CPU).

SGLang captures one graph per batch-size bucket and replays it for every step whose batch
fits: the batch is padded up to the bucket with requests that attend one row, the dummy
slot 0 (padded `seq_lens` are 1, their cache location row 0), and the kv_indices buffer
the graph reads has room for the largest step (SGLang: max_bs * max_context_len; here the
largest padded step of the schedule). Buckets are SGLang 0.5.23's defaults without
speculative decoding (`generate_decode_cuda_graph_batch_sizes`) for its default largest bucket
(`cuda_graph_max_bs`) of a TP >= 4 server on a GPU of 60 GB or more: 512 (`_handle_gpu_memory_settings`;
checked against SGLang's own code in suites/sglang/test_cuda_graph_buckets.py). SGLang runs a larger batch
eagerly; here it gets a graph of its own size.
"""

from __future__ import annotations

import numpy as np

from harness.spec.schedule import Schedule, StepBatch

MAX_BS = 512
BUCKETS = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, MAX_BS, 16), MAX_BS)
PAD_REQUEST = -1  # request id of a padding entry
PAD_ROW = 0  # the dummy slot every padding entry reads and targets (SGLang's KV write skips it; it stays all-zero)


def bucket_for(batch_size: int, buckets=BUCKETS) -> int:
    """The smallest bucket that holds `batch_size` (beyond the largest, a graph of the batch's own size)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    return next((b for b in buckets if b >= batch_size), batch_size)


def pad_batch(batch: StepBatch, size: int) -> StepBatch:
    """`batch` padded to `size` requests; each padding request attends row 0 only, and its write targets row 0."""
    pad = size - batch.batch_size
    if pad < 0:
        raise ValueError(f"batch of {batch.batch_size} does not fit a bucket of {size}")
    if pad == 0:
        return batch
    nnz = int(batch.kv_indptr[-1])
    return StepBatch(
        step=batch.step,
        request_ids=np.concatenate([batch.request_ids, np.full(pad, PAD_REQUEST, np.int64)]),
        kv_indptr=np.concatenate([batch.kv_indptr, nnz + np.arange(1, pad + 1)]).astype(np.int32),
        kv_indices=np.concatenate([batch.kv_indices, np.full(pad, PAD_ROW, np.int32)]),
        index_gens=np.concatenate([batch.index_gens, np.zeros(pad, np.int64)]),
        write_slots=np.concatenate([batch.write_slots, np.full(pad, PAD_ROW, np.int64)]),
        reused_slots=batch.reused_slots,
    )


def bucket_capacities(schedule: Schedule, buckets=BUCKETS) -> dict[int, int]:
    """{bucket: kv_indices capacity}: the largest padded step of the schedule in each bucket used."""
    out: dict[int, int] = {}
    for batch in schedule.steps:
        bucket = bucket_for(batch.batch_size, buckets)
        out[bucket] = max(out.get(bucket, 0), len(pad_batch(batch, bucket).kv_indices))
    return out
