"""ci/experiments/ncu_fused (issue 28's cross-check) on CPU: reading ncu's raw CSV, one launch's figures and the
agreement criterion, with their twins (a disagreement beyond the tolerance, an unfiltered range)."""

from __future__ import annotations

import pytest

from ci.experiments.ncu_fused import ncu_fused as exp

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",' \
         '"dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"'
UNITS = '"","","","","","","","","","","","byte","byte","nsecond"'


def kernel_row(i: int, name: str, ns: str, read: str = "1,000", write: str = "100") -> str:
    return f'"{i}","42","python3","h","{name}","1","7","(256, 1, 1)","(8, 30, 1)","0","9.0","{read}","{write}","{ns}"'


def log(launches: int, decode_ns=(26000, 26400, 25800, 26200, 26100)) -> str:
    rows = []
    for i in range(launches):  # each call: the decode kernel, then the combine
        rows += [kernel_row(2 * i, "fused_mla_decode<8, 2, 8>", f"{decode_ns[i]:,}"), kernel_row(2 * i + 1, "combine", "1500")]
    return "\n".join(["==PROF== Connected to process 42", "step 0 ...", HEADER, UNITS, *rows, "==PROF== Disconnected"])


def test_one_call_is_the_median_over_calls_of_its_kernels_sum():
    kernels = exp.parse_ncu_csv(log(5))
    assert len(kernels) == 10 and kernels[0]["ns"] == 26000.0 and kernels[0]["read"] == 1000.0
    one = exp.per_launch(kernels, 5)
    assert one["us"] == pytest.approx((26100 + 1500) / 1e3) and one["dram_bytes"] == 2 * 1100
    assert [k["us"] for k in one["kernels"]] == pytest.approx([26.1, 1.5]) and one["longest_us"] == pytest.approx(26.1)


def test_an_unfiltered_range_is_refused():
    """Twin: a kernel count that is not a multiple of the calls, or calls that launched different kernels
    (the NVTX filter let others in)."""
    kernels = exp.parse_ncu_csv(log(5))
    with pytest.raises(ValueError, match="expected a multiple of 5"):
        exp.per_launch(kernels[:-1], 5)
    swapped = kernels[:2] + [kernels[3], kernels[2]] + kernels[4:]
    with pytest.raises(ValueError, match="did not launch the same kernels"):
        exp.per_launch(swapped, 5)
    with pytest.raises(ValueError, match="no ncu CSV header"):
        exp.parse_ncu_csv("==PROF== No kernels were profiled.")


@pytest.mark.parametrize("ncu_us, agree", [(27.0, True), (28.7, False), (25.7, True), (25.6, False)])
def test_agreement_is_within_the_tolerance(ncu_us, agree):
    """One kernel a call: agreement is |harness / ncu - 1| within the tolerance, on both sides."""
    measured = {"attn_us": [26.9, 27.0, 27.1], "attn_bytes": 70_000_000, "copy_gbps": 4200.0}
    r = exp.judge("b32-l4096", measured, {"us": ncu_us, "longest_us": ncu_us, "dram_bytes": 71_600_000, "kernels": []}, 0.05)
    assert r["agree"] is agree and r["floor_us"] == pytest.approx(70e6 / 4200e9 * 1e6)
    assert r["harness_floor_ratio"] == pytest.approx(27.0 / r["floor_us"])


@pytest.mark.parametrize("harness_us, agree", [(43.7, True), (35.0, False), (71.0, False)])
def test_overlapping_kernels_bound_the_call(harness_us, agree):
    """Two kernels run beside each other (ncu times them alone): the harness lies between the longest
    (37.9 us) and the sum (67.0 us), widened by the tolerance; twins below and above."""
    measured = {"attn_us": [harness_us], "attn_bytes": 72_000_000, "copy_gbps": 4200.0}
    ncu = {"us": 67.0, "longest_us": 37.9, "dram_bytes": 74_600_000, "kernels": []}
    assert exp.judge("b32-l4096", measured, ncu, 0.05)["agree"] is agree


def test_ncu_runs_the_launcher_in_the_nvtx_range_with_base_units(tmp_path):
    cmd = exp.ncu_command("ncu", tmp_path / "x.csv", ["--scenario", "b32-l4096"])
    assert cmd[:3] == ["ncu", "--clock-control", "none"] and "--nvtx-include" in cmd and "attn/" in cmd
    assert cmd[cmd.index("--print-units") + 1] == "base" and cmd[-3:] == ["profile", "--scenario", "b32-l4096"]
    from ci.experiments.ncu_fused import launch

    assert launch.NVTX_RANGE + "/" == cmd[cmd.index("--nvtx-include") + 1]


def test_cupti_spans_are_per_replay_over_its_calls():
    """The third timer: per replay the first kernel's start to the last one's end (kernels overlap: the span,
    not their sum), over the calls; a count that is not the same each replay is refused."""
    from ci.experiments.ncu_fused.launch import spans_per_call

    # two replays of 2 calls, each call one kernel overlapping the next by 1 us
    kernels = [(0.0, 30.0), (29.0, 61.0), (100.0, 131.0), (130.0, 162.0)]
    assert spans_per_call(kernels, 2, 2) == pytest.approx([30.5, 31.0])
    with pytest.raises(ValueError, match="same kernels in each of 2 replays"):
        spans_per_call(kernels[:3], 2, 2)
    measured = {"attn_us": [31.0], "attn_bytes": 70_000_000, "copy_gbps": 3000.0, "cupti_us": [30.5, 31.0, 30.9]}
    row = exp.judge("b32-l4096", measured, {"us": 33.0, "longest_us": 33.0, "dram_bytes": 1, "kernels": []}, 0.05)
    assert row["cupti_ratio"] == pytest.approx(30.9 / 31.0) and row["agree"] is False  # ncu's verdict alone
    doc = {"preset": "p", "strategy": "s", "tolerance": 0.05, "scenarios": [row], "agree": False, "command": "c"}
    assert "| 0.997 |" in exp.markdown(doc)
    del measured["cupti_us"]
    assert exp.judge("b32-l4096", measured, {"us": 31.0, "longest_us": 31.0, "dram_bytes": 1, "kernels": []}, 0.05)["cupti_us"] is None
