"""SGLang-style bucket replay on the GPU: one captured graph per batch bucket, re-planned through
FlashInfer's fast path for each later step, gives the eager step's outputs (fa3 and fa2)."""

import pytest

from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from harness.spec.buckets import pad_batch
from harness.strategies import ORDER
from harness.verify.check import check_against_golden, policy
from suites.helpers import flashinfer_or_skip

pytestmark = [pytest.mark.gpu]
CASE = "glm5-tp8.ci.multistep-reuse"  # 4 requests, then 3 (padded to the bucket of 4) for three steps


@pytest.fixture(scope="module", params=["fa3", "fa2"])
def prep(request, gpu_device):
    flashinfer_or_skip(gpu_device, request.param)  # fa3 runs on SM90 only: elsewhere a skip naming the policy
    return PreparedCase(load_case(CASE), gpu_device, "flashinfer", request.param).build()


def _eager(prep, strategy, layers):
    with prep.session(strategy) as session:
        return session.run_all(layers)


def _problems(prep, strategy, replayed, eager):
    tol = policy(strategy, prep.backend.name)
    bad = []
    for key, (out, lse) in replayed.items():
        n = eager[key][0].shape[0]
        verdict = check_against_golden(out[:n], lse[:n], eager[key][0].float(), eager[key][1], tol)
        if not verdict.passed:
            bad.append(f"{key}: {verdict.reason}")
    return bad


@pytest.mark.parametrize("strategy", ORDER)
def test_bucket_replay_matches_the_eager_steps(prep, strategy):
    if reason := prep.unsupported_reason(strategy):
        pytest.skip(reason)
    layers = set(range(prep.geometry.num_layers))
    eager = _eager(prep, strategy, layers)
    with prep.session(strategy) as session:
        replayed = {}
        for batch in prep.schedule.steps:
            graph = session.bucket_graph(batch, layers)
            graph.load(batch)
            replayed.update(graph.replay())
        assert len(session._graphs) == 1  # one bucket: every step of the scenario replays one graph
    assert set(replayed) == set(eager)
    assert not _problems(prep, strategy, replayed, eager)


def test_a_stale_plan_is_detected(prep):
    """Negative control: loading a later step's inputs without re-planning must not pass."""
    layers = set(range(prep.geometry.num_layers))
    eager = _eager(prep, "gather_cast", layers)
    with prep.session("gather_cast") as session:
        first, second = prep.schedule.steps[:2]
        graph = session.bucket_graph(first, layers)
        graph.load(first)
        graph.replay()
        graph._copy_inputs(second)  # the inputs move on, the plan and kv_indices do not
        graph.batch = pad_batch(second, graph.bucket)
        stale = graph.replay()
    assert _problems(prep, "gather_cast", stale, {k: v for k, v in eager.items() if k[0] == second.step})
