"""Pool bytes and queries generated on CUDA equal those generated on the CPU."""

import numpy as np
import pytest
import torch

from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from harness.inputs.pool import KVPool, PoolGeometry, kv_rows
from harness.inputs.reference import step_queries
from harness.spec import synth

pytestmark = pytest.mark.gpu


@pytest.mark.prod
def test_prod_layer_fill_matches_cpu_generator(gpu_device):
    geometry = PoolGeometry(495_552, 2, 576)
    pool = KVPool(geometry, seed=2, device=gpu_device)
    rng = np.random.default_rng(0)
    for layer in range(2):
        slots = np.concatenate([[1, 2, 495_552], rng.integers(1, 495_553, 4093)])
        on_gpu = pool.buffers[layer][torch.as_tensor(slots, device=gpu_device), 0].cpu()
        assert torch.equal(on_gpu, synth.kv_codes(2, layer, slots, 0, 576))
        assert not bool(pool.buffers[layer][0].any())


def test_paged_fill_matches_cpu(gpu_device):
    """GLM-5's 64-token-page pool: the Triton fill leaves the first page zero and matches the CPU fill."""
    geometry = PoolGeometry(16_384, 1, 576, page_size=64, index_k_bytes=132)
    gpu = KVPool(geometry, seed=4, device=gpu_device)
    cpu = KVPool(geometry, seed=4, device=torch.device("cpu"))
    assert torch.equal(gpu.buffers[0].cpu(), cpu.buffers[0]) and not bool(gpu.buffers[0][:64].any())
    assert gpu.index_k[0].shape == cpu.index_k[0].shape


def test_written_rows_and_queries_match_cpu(gpu_device):
    case = load_case("glm5-tp8.ci.multistep-reuse")
    gpu = PreparedCase(case, gpu_device, "torch").build().data
    for batch in case.schedule().steps:
        for layer in range(case.num_layers):
            q_nope, q_pe = step_queries(case.preset, case.scenario.seed, batch, layer)
            assert torch.equal(gpu.queries[(batch.step, layer)][0].cpu(), q_nope)
            assert torch.equal(gpu.queries[(batch.step, layer)][1].cpu(), q_pe)
            cpu_rows = kv_rows(case.scenario.seed, layer, batch.write_slots, batch.write_gen, 576, torch.device("cpu"))
            assert torch.equal(gpu.new_rows[(batch.step, layer)].cpu(), cpu_rows)


def test_generator_mismatch_is_detectable(gpu_device):
    """Negative control: another seed's GPU fill differs from the CPU generator."""
    pool = KVPool(PoolGeometry(1000, 1, 576), seed=3, device=gpu_device)
    assert not torch.equal(pool.buffers[0][1:, 0].cpu(), synth.kv_codes(4, 0, np.arange(1, 1001), 0, 576))
