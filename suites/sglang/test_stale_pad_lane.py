"""Bucket replay of a step smaller than its bucket's first: the padding lanes must write nothing (row 0), not the
earlier step's rows into its slots (which a finished request freed and another request's new token now holds)."""

from __future__ import annotations

import dataclasses

import pytest
import sgl
import torch

from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from harness.spec.scenario import Finish

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("strategy", ["stock", "sglang_flashinfer"])
def test_a_shrunk_step_replays_as_the_eager_step(strategy):
    sgl.require()
    case = load_case("deepseek-v3-tp8.ci.b1-l500")
    scenario = dataclasses.replace(case.scenario, name="stale-lane", steps=3, kv_lens=(4, 4, 4, 4),
                                   finish=(Finish(after_step=0, request=3),))
    prep = PreparedCase(dataclasses.replace(case, scenario=scenario), torch.device("cpu")).build()
    assert int(prep.schedule.steps[0].write_slots[3]) in prep.schedule.steps[2].write_slots  # lane 3's old slot reused
    layers = set(range(prep.geometry.num_layers))
    with prep.session(strategy) as session:
        eager = {}
        for batch in prep.schedule.steps:
            eager.update(session.step(batch, layers))
    with prep.session(strategy) as session:
        for batch in prep.schedule.steps:
            graph = session.bucket_graph(batch, layers)
            graph.load(batch)
            for key, (out, _) in graph.replay().items():
                assert torch.equal(out[: batch.batch_size].view(torch.int16), eager[key][0].view(torch.int16)), key
