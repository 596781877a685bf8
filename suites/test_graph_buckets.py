"""SGLang-style bucket replay on the CPU: bucket choice, padding, capacity, and the eager
replay of padded steps equal to the unpadded step bit for bit (the CUDA graph runs the same loop)."""

import numpy as np
import pytest
import torch

from harness.backends import make_backend
from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from harness.spec.buckets import PAD_ROW, bucket_capacities, bucket_for, pad_batch
from harness.strategies import ORDER, REGISTRY
from suites.helpers import assert_replay_equals_eager, shrunk_step_case

CPU = torch.device("cpu")
CPU_STRATEGIES = [n for n in ORDER if REGISTRY[n].unsupported_reason(CPU, make_backend("torch", CPU)) is None]


def test_buckets_follow_sglang_defaults():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 12, 13, 17, 128, 129, 257, 497, 600)] == [1, 2, 4, 8, 12, 16, 24, 128, 136, 272, 512, 600]
    with pytest.raises(ValueError):
        bucket_for(0)


@pytest.fixture(scope="module")
def prep():
    return PreparedCase(load_case("glm5-tp8.ci.multistep-reuse"), torch.device("cpu")).build()


def test_padding_reads_and_writes_only_the_dummy_row(prep):
    batch = prep.schedule.steps[1]  # 3 requests after one finished
    padded = pad_batch(batch, bucket_for(batch.batch_size))
    assert padded.batch_size == 4 and np.array_equal(padded.kv_indptr[:-1], batch.kv_indptr)
    assert padded.kv_indptr[-1] - padded.kv_indptr[-2] == 1 and padded.kv_indices[-1] == PAD_ROW
    assert padded.write_slots[-1] == PAD_ROW and np.array_equal(padded.kv_indices[:-1], batch.kv_indices)
    caps = bucket_capacities(prep.schedule)
    assert list(caps) == [4] and caps[4] == max(len(pad_batch(b, 4).kv_indices) for b in prep.schedule.steps)


@pytest.mark.parametrize("strategy", CPU_STRATEGIES)
def test_bucket_replay_equals_the_eager_step(prep, strategy):
    assert_replay_equals_eager(prep, strategy)
    assert not bool(prep.pool.buffers[0][PAD_ROW].any()), "padding wrote into the dummy row"


def test_a_wrong_device_count_is_detected(prep):
    """Negative control: gather_cast's device-side count one row short changes the output (a step that fills its
    bucket: with padding the row dropped is a padding lane's). The compact buffer is torch.empty: poisoned here, since
    the allocator may hand back the eager session's freed buffer, whose last row is already the right one."""
    batch, layer = prep.schedule.steps[0], 0
    with prep.session("gather_cast") as session:
        eager = session.step(batch, {layer})[(batch.step, layer)][0]
    with prep.session("gather_cast") as session:
        graph = session.bucket_graph(batch, {layer})
        graph.load(batch)
        session.strategy.count -= 1
        session.strategy.compact.fill_(float("nan"))
        out = graph.replay()[(batch.step, layer)][0]
    assert not torch.equal(out[: batch.batch_size].view(torch.int16), eager.view(torch.int16))


@pytest.mark.parametrize("strategy", CPU_STRATEGIES)
def test_a_shrunk_step_replays_as_the_eager_step(strategy):
    """Padding lanes of a smaller step write row 0, not the bucket's earlier rows into reused slots (twin: the
    same check through SGLang's own path in suites/sglang/test_stale_pad_lane.py)."""
    assert_replay_equals_eager(shrunk_step_case(), strategy)
