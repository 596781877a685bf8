"""SGLang's own CUDA-graph batch sizes and padded-lane length agree with harness/spec/buckets.py."""

from __future__ import annotations

import argparse

import pytest
import sgl

from harness.spec.buckets import BUCKETS, MAX_BS, bucket_for

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def _sglang():
    sgl.require()


def _server_args(*argv: str) -> argparse.Namespace:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(["--model-path", "unused", *argv])


def test_buckets_are_sglangs_default_decode_capture_sizes():
    """generate_decode_cuda_graph_batch_sizes under SGLang's default flags, up to the default largest bucket
    of a TP >= 4 server on a 60 GB+ GPU (512), is the harness's bucket list; a batch goes to the first that holds it."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes

    sizes = generate_decode_cuda_graph_batch_sizes(_server_args(), MAX_BS)
    assert tuple(sizes) == BUCKETS
    assert [bucket_for(n) for n in range(1, MAX_BS + 1)] == [next(s for s in sizes if s >= n) for n in range(1, MAX_BS + 1)]


def test_bucket_check_catches_another_capture_policy():
    """Negative control: SGLang's list without padding (every size captured) is not the harness's."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes

    assert tuple(generate_decode_cuda_graph_batch_sizes(_server_args("--disable-cuda-graph-padding"), MAX_BS)) != BUCKETS


def test_padded_lanes_attend_one_token():
    """SGLang fills a padded lane's seq_len with the backend's fill value: 1 for the FlashInfer MLA backend,
    the one row (the dummy row 0) harness/spec/buckets.pad_batch gives each padding request."""
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    backend = object.__new__(FlashInferMLAAttnBackend)
    assert backend.get_cuda_graph_seq_len_fill_value() == 1
