"""The SGLang TPOT driver's own parts on CPU without SGLang: config folder, one-rank overrides,
command line, latency parsing (the engine itself: suites/sglang/test_sglang_driver.py)."""

import json
import stat
import statistics
import sys

import pytest

from harness.errors import HarnessError
from harness.tpot import sglang_driver
from harness.tpot.config import load_shape


def test_config_folder_and_one_rank_overrides(tmp_path):
    shape = load_shape("glm5-tp8")
    folder = sglang_driver.write_model_folder(shape, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["num_hidden_layers"] == 78
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128] and cfg["vocab_size"] == 154880
    assert sglang_driver.one_rank_overrides(shape) == {"num_attention_heads": 8, "num_key_value_heads": 8,
                                                        "moe_intermediate_size": 256, "intermediate_size": 1536, "vocab_size": 19360}
    args = sglang_driver.one_batch_args(folder, shape, 32, 4096, 16, tmp_path / "r.jsonl", 495_552)
    pairs = dict(zip(args[::1], args[1::1]))
    assert pairs["--max-total-tokens"] == "495552"  # SGLang's pool: the case's slots, not what free memory gives
    assert pairs["--load-format"] == "dummy" and pairs["--kv-cache-dtype"] == "fp8_e4m3" and pairs["--attention-backend"] == "flashinfer"
    assert json.loads(pairs["--json-model-override-args"])["num_attention_heads"] == 8 and pairs["--tp-size"] == "1"
    assert pairs["--log-decode-step"] == "1"  # every step's latency logged: the samples


def test_decode_latency_from_result_file_then_log(tmp_path):
    result = tmp_path / "r.jsonl"
    result.write_text(json.dumps({"median_decode_latency": 0.0125}) + "\n")
    assert sglang_driver.parse_decode_ms(result, "") == pytest.approx(12.5)
    log = "Decode 0. latency: 0.02 s\nDecode.  median latency: 0.01530 s, median throughput:     65.36 token/s\n"
    assert sglang_driver.parse_decode_ms(tmp_path / "missing.jsonl", log) == pytest.approx(15.3)
    with pytest.raises(HarnessError):
        sglang_driver.parse_decode_ms(tmp_path / "missing.jsonl", "Prefill. latency: 0.5 s")


def one_batch_log(batch: int, steps_s: list[float], warmup: int = 5) -> str:
    """What sglang 0.5.23's one_batch prints with --log-decode-step 1 (latency_test_run_once's format):
    a warmup run's first steps, then the measured run's every step and SGLang's median."""
    lines = ["Warmup ...", "Prefill. latency: 0.20000 s, throughput:  20480.00 token/s"]
    lines += [f"Decode {i}. Batch size: {batch}, latency: 0.09000 s, throughput:     11.11 token/s" for i in range(warmup)]
    lines += ["Benchmark ...", "Prefill. latency: 0.10000 s, throughput:  40960.00 token/s"]
    lines += [f"Decode {i}. Batch size: {batch}, latency: {s:6.5f} s, throughput: {batch / s:9.2f} token/s" for i, s in enumerate(steps_s)]
    lines += [f"Decode.  median latency: {statistics.median(steps_s):6.5f} s, median throughput: 1.00 token/s", "Total. latency: 1.000 s"]
    return "\n".join(lines) + "\n"


def test_every_decode_step_of_the_measured_run_is_a_sample():
    steps = [0.0201, 0.0199, 0.0203, 0.0200, 0.0202, 0.0250, 0.0198]
    log = one_batch_log(4, steps)
    assert sglang_driver.parse_step_ms(log, 4, len(steps) + 1) == pytest.approx([s * 1e3 for s in steps])  # not the warmup's 90 ms


@pytest.mark.parametrize("log, why", [
    (one_batch_log(4, [0.02] * 6), "one step missing"),
    (one_batch_log(4, [0.02] * 8), "one step too many"),
    (one_batch_log(8, [0.02] * 7), "another batch size"),
    (one_batch_log(4, [0.02] * 7).replace("Benchmark ...", "Bench"), "no measured run"),
    (one_batch_log(4, [0.02] * 7).replace("Decode 3.", "Decode 9."), "steps out of order"),
])
def test_a_log_that_is_not_the_runs_every_step_is_refused(log, why):
    """The samples are exactly the run's output_len - 1 decode steps of its batch, in order; twin: the test above."""
    with pytest.raises(HarnessError, match="sglang one_batch"):
        sglang_driver.parse_step_ms(log, 4, 8)


FAKE_SGLANG = "0.0.0-fake"


def _fake_python(tmp_path, body: str):
    """A stand-in interpreter for the plumbing test: `-c CODE` (the software probe) runs CODE with a stand-in sglang
    FAKE_SGLANG importable; anything else prints what one_batch would (`body`)."""
    site = tmp_path / "fake-site"
    (site / "sglang").mkdir(parents=True, exist_ok=True)
    (site / "sglang" / "__init__.py").write_text(f"__version__ = {FAKE_SGLANG!r}\n")
    exe = tmp_path / "fake-python"
    probe = f"if sys.argv[1:2] == ['-c']:\n    sys.path.insert(0, {str(site)!r})\n    exec(sys.argv[2])\n    sys.exit()\n"
    exe.write_text(f"#!{sys.executable}\nimport sys\n{probe}{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def sglang_pool(slots: int | None = None, page_size: int | None = None, own_line: bool = True, launcher_line: bool = True) -> str:
    """Stand-in lines for the pool SGLang built: the launcher's report (sglang_launch.POOL_MARK, read from SGLang's pool
    object) and SGLang's own `max_total_num_tokens=` line. Default: the --max-total-tokens the driver asked for, as SGLang
    builds it when memory allows; `slots`: another size (SGLang capped by memory, or a pool sized otherwise)."""
    size = "int(a[a.index('--max-total-tokens') + 1])" if slots is None else str(slots)
    page = "(64 if '--dsa-decode-backend' in a else 1)" if page_size is None else str(page_size)
    body = f"import json\na = sys.argv\nn, p = {size}, {page}\n"
    if launcher_line:
        body += ("print('mla-harness sglang pool: ' + json.dumps({'slots': n, 'page_size': p, 'rows': n + p, 'row_bytes': 576, "
                 "'layers': 3, 'pool': 'MLATokenToKVPool', 'max_total_num_tokens': n}))\n")
    if own_line:
        body += "print(f'max_total_num_tokens={n}')\n"
    return body


def test_driver_runs_the_launcher_and_reads_its_latency(tmp_path):
    log = one_batch_log(1, [0.019, 0.020, 0.021, 0.020, 0.022, 0.020, 0.019])
    python = _fake_python(tmp_path, sglang_pool() + f"print(' '.join(sys.argv[1:5]))\nprint({log!r})")
    out = sglang_driver.run(load_shape("deepseek-v3-tp8"), "gather_cast", 1, 4096, 8, tmp_path, 16_384, python=python)
    assert out["tpot_ms"] == pytest.approx(20.0) and len(out["step_ms"]) == 7 and out["sglang_median_ms"] == pytest.approx(20.0)
    assert out["command"][1:5] == ["-m", "harness.tpot.sglang_launch", "--strategy", "gather_cast"]
    assert "-m harness.tpot.sglang_launch --strategy" in out["log_tail"]


def test_driver_failure_is_one_error_naming_the_engine(tmp_path):
    python = _fake_python(tmp_path, "print('RuntimeError: no CUDA GPU'); sys.exit(3)")
    with pytest.raises(HarnessError) as err:
        sglang_driver.run(load_shape("glm5-tp8"), "stock", 1, 4096, 8, tmp_path, 16_384, python=python)
    assert "sglang one_batch" in str(err.value) and "exit 3" in str(err.value)


def test_cli_engine_sglang_rejects_strategies_it_cannot_install(tmp_path, capsys):
    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    out = tmp_path / "r.json"
    assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                 "--strategy", "gather_cast", "--strategy", "shadow", "--json", str(out)]) == 0
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["gather_cast"]["value"] == pytest.approx(30.0) and rows["shadow"]["value"] is None
    assert rows["gather_cast"]["samples"] == pytest.approx([30.0] * 31)
    assert "unsupported" in rows["shadow"]["detail"] and len(list((tmp_path / "w").glob("model-*/config.json"))) == 1


def test_cli_engine_sglang_records_the_software_of_its_python(tmp_path):
    """The results name the SGLang (version, folder), torch and Python that --sglang-python ran, not the harness's
    own (before: this process's environment, sglang null here); a Python that cannot import sglang is one line."""
    import platform

    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    out = tmp_path / "r.json"
    assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                 "--strategy", "gather_cast", "--json", str(out)]) == 0
    env = json.loads(out.read_text())["environment"]
    assert env["sglang"] == FAKE_SGLANG and env["sglang_path"] == str((tmp_path / "fake-site" / "sglang").resolve())
    assert env["python"] == platform.python_version() and env["torch"]


def test_tpot_report_describes_an_sglang_engine_run_as_sglangs(tmp_path):
    """Its rows carry SGLang's command, not the harness model's layers, weight sets and pool (before: 'None layers,
    None rotated weight sets ... pool 0.0 GB')."""
    from harness.cli import main
    from harness.tpot.report import main as report

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    out = tmp_path / "r.json"
    assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                 "--strategy", "gather_cast", "--json", str(out)]) == 0
    assert report([str(out), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "tpot.md").read_text()
    assert "SGLang's own sglang.benchmark.one_batch (--engine sglang)" in md and "harness.tpot.sglang_launch" in md
    assert "None layers" not in md and "pool 0.0 GB" not in md


def test_cli_engine_sglang_keeps_a_workdir_it_did_not_make(tmp_path, capsys):
    """--sglang-workdir holding the user's files (a real model's config.json, a results file named as the driver's):
    refused before anything runs, every file as it was; the twin: a folder an earlier run made is used again."""
    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    work = tmp_path / "mine"
    (work / "model").mkdir(parents=True)
    (work / "model" / "config.json").write_text('{"my": "model"}')
    (work / "one_batch-gather_cast.jsonl").write_text("mine")
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--strategy", "gather_cast"]
    assert main([*argv, "--sglang-workdir", str(work)]) == 2
    assert "holds files the harness did not write" in capsys.readouterr().err
    assert (work / "model" / "config.json").read_text() == '{"my": "model"}'
    assert (work / "one_batch-gather_cast.jsonl").read_text() == "mine"
    for _ in range(2):  # twin: a new folder, then the same one again
        assert main([*argv, "--sglang-workdir", str(tmp_path / "w")]) == 0


def test_cli_engine_sglang_never_replaces_a_config_json(tmp_path, capsys):
    """A workdir an earlier run made (its mark) where the user then put a model's config.json: a second run keeps it
    (before: replaced in place by the run's); the run's config goes to a folder named by its content, used again as it
    is by the next run; one of other content at that path is kept and the run refused, one line naming it, exit 2."""
    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    work, out = tmp_path / "w", tmp_path / "r.json"
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(work),
            "--strategy", "gather_cast"]
    assert main(argv) == 0
    mine = work / "model" / "config.json"
    mine.parent.mkdir(exist_ok=True)
    mine.write_text('{"my": "model"}')
    assert main([*argv, "--json", str(out)]) == 0 and mine.read_text() == '{"my": "model"}'
    (config,) = work.glob("model-*/config.json")
    command = json.loads(out.read_text())["rows"][0]["detail"]["command"]
    assert command[command.index("--model-path") + 1] == str(config.parent)
    config.write_text('{"mine": 1}')
    capsys.readouterr()
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --sglang-workdir") and str(config) in line, line
    assert config.read_text() == '{"mine": 1}' and mine.read_text() == '{"my": "model"}'


def test_compare_gates_sglang_engine_results_on_their_steps(tmp_path, monkeypatch, capsys):
    """The steps are samples `compare` judges: a head whose every step is 20% slower fails (exit 1); a head
    with the base's steps in another order (one nudged by a hair: a reordered copy is one run, refused) passes (twin)."""
    import random

    from harness.cli import main
    from suites.helpers import as_on_a_gpu_box

    as_on_a_gpu_box(monkeypatch)
    base_steps = [0.020 + 0.0001 * (i % 7) for i in range(31)]

    def results(name, steps):
        python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, steps)!r})")
        out = tmp_path / f"{name}.json"
        assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                     "--strategy", "gather_cast", "--json", str(out)]) == 0
        return str(out)

    base = results("base", base_steps)
    slow = results("slow", [s * 1.2 for s in base_steps])
    shuffled = random.Random(0).sample(base_steps, len(base_steps))
    same = results("same", [shuffled[0] + 1e-5, *shuffled[1:]])  # one nudged: the same multiset is the same run
    capsys.readouterr()
    assert main(["compare", base, slow]) == 1
    assert "REGRESSION" in capsys.readouterr().out
    assert main(["compare", base, same]) == 0


def test_cli_engine_sglang_runs_under_the_clock_guard_beside_the_control(tmp_path, monkeypatch, capsys):
    """As native tpot: each SGLang run under the clock guard (on CPU: not recorded, said), its guard in its row's detail,
    and the control row compare checks the environment with; a GPU whose SM clock drops in every run: rows marked
    disturbed, compare cannot judge them (DISTURBED, exit 2). Before: neither, a throttled GPU's steps judged as clean.
    The GPU is the one SGLang runs on, rank 0's (cuda:0), whatever --device names."""
    import torch

    from harness.cli import main
    from harness.tpot import cli
    from suites.helpers import as_on_a_gpu_box, clocks_drop_in_every_block

    def results(name, steps):
        python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, steps)!r})")
        out = tmp_path / f"{name}.json"
        assert main(["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
                     "--strategy", "gather_cast", "--json", str(out)]) == 0
        return {r["metric"]: r for r in json.loads(out.read_text())["rows"]}, str(out)

    rows, _ = results("cpu", [0.03] * 31)
    assert rows["tpot_ms"]["detail"]["guard"] == {"disturbed": None, "reruns": 0, "clocks": "not recorded on cpu"}
    assert rows["control_copy_gbps"]["strategy"] == "control" and rows["control_copy_gbps"]["value"] > 0
    as_on_a_gpu_box(monkeypatch)
    clocks_drop_in_every_block(monkeypatch)
    (rows, base), (_, head) = results("base", [0.020 + 0.0001 * (i % 7) for i in range(31)]), results("head", [0.021] * 31)
    assert rows["tpot_ms"]["detail"]["guard"]["disturbed"] == "SM clock 1980 -> 1200 MHz"
    capsys.readouterr()
    assert main(["compare", base, head]) == 2
    assert "DISTURBED: gather_cast/tpot_ms (clock guard: SM clock 1980 -> 1200 MHz)" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.torch_device() == torch.device("cuda", 0)


def test_cli_engine_sglang_never_writes_json_into_its_workdir_or_over_its_python(tmp_path, capsys):
    """--json equal to or inside --sglang-workdir (the driver's folder: it replaces one_batch-*.jsonl there), or the
    --sglang-python it runs: refused before anything runs, nothing made or changed (before: the folder case ran
    SGLang, then could not write; the jsonl case wrote the results where the next run unlinks them; --force
    replaced the interpreter); twin: a --json beside the workdir is written."""
    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    before = open(python).read()
    work = tmp_path / "w"
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(work),
            "--strategy", "gather_cast", "--force"]
    for out, fragment in ((work, "--sglang-workdir"), (work / "one_batch-gather_cast.jsonl", "--sglang-workdir"),
                          (python, "--sglang-python")):
        assert main([*argv, "--json", str(out)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: --json") and fragment in line, line
        assert not work.exists() and open(python).read() == before
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0 and (tmp_path / "r.json").exists()


def test_cli_engine_sglang_runs_the_layers_its_results_name(tmp_path, capsys):
    """case.layers names what SGLang ran: --layers 3 writes a 3-layer model (before: the results said 3 layers while
    SGLang's config.json had all 78); more layers than the model has is one error line naming --layers."""
    from harness.cli import main

    python = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    out, work = tmp_path / "r.json", tmp_path / "w"
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(work),
            "--strategy", "gather_cast"]
    assert main([*argv, "--layers", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["case"]["layers"] == 3
    (config,) = work.glob("model-*/config.json")
    cfg = json.loads(config.read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["first_k_dense_replace"] == 3
    assert "gather_cast: sglang.benchmark.one_batch: 1/1 in" in capsys.readouterr().out  # each SGLang run is a progress phase
    assert main([*argv, "--shrink", "--layers", "5"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --layers") and "3 layers" in line


RUN_LOG = one_batch_log(1, [0.03] * 7)


@pytest.mark.parametrize("pool, why", [
    (sglang_pool(slots=400_000), "SGLang capped the pool by free memory (its profiled value under --max-total-tokens)"),
    (sglang_pool(slots=495_552, own_line=False), "the launcher's report of SGLang's pool object says another size"),
    (sglang_pool(slots=495_552, launcher_line=False), "SGLang's own max_total_num_tokens= line (tp > 1: no launcher report)"),
    (sglang_pool(page_size=1), "another page size: the same slots, other rows (what stock casts)"),
    ("", "no pool size in the log at all"),
])
def test_driver_refuses_a_pool_other_than_the_cases(tmp_path, pool, why):
    """The results say case.slots; a run on any other pool is refused (one error naming both), not recorded under
    that label. Twin: test_driver_runs_the_launcher_and_reads_its_latency (the pool SGLang was asked for)."""
    python = _fake_python(tmp_path, pool + f"print({RUN_LOG!r})")
    with pytest.raises(HarnessError, match="KV pool") as err:
        sglang_driver.run(load_shape("glm5-tp8"), "stock", 1, 4096, 8, tmp_path, 16_384, python=python)
    assert "16384" in str(err.value).replace(",", "") and "\n" not in str(err.value), why


def test_a_launcher_that_stops_on_a_pool_mismatch_is_reported_as_the_mismatch(tmp_path):
    """The launcher exits 2 right after SGLang builds a pool of another size (no benchmark run on it): the error names
    the pool, not just an exit code."""
    python = _fake_python(tmp_path, sglang_pool(slots=400_000) + "print('mla-harness: stopped', file=sys.stderr); sys.exit(2)")
    with pytest.raises(HarnessError, match="400,000") as err:
        sglang_driver.run(load_shape("glm5-tp8"), "stock", 1, 4096, 8, tmp_path, 16_384, python=python)
    assert "16,384" in str(err.value)


def test_cli_engine_sglang_refuses_a_mislabelled_pool(tmp_path, capsys):
    """End to end: SGLang (stand-in) built a 400,000-slot pool for a 16,384-slot case: exit 2, one error line, no results
    JSON; twin: the pool it was asked for is recorded, its report kept in the row's detail."""
    from harness.cli import main

    out, work = tmp_path / "r.json", tmp_path / "w"
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-workdir", str(work), "--strategy", "stock", "--json", str(out)]
    bad = _fake_python(tmp_path, sglang_pool(slots=400_000) + f"print({one_batch_log(1, [0.03] * 31)!r})")
    assert main([*argv, "--sglang-python", bad]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: sglang one_batch") and "400,000" in line and "16,384" in line, line
    assert not out.exists()
    good = _fake_python(tmp_path, sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    assert main([*argv, "--sglang-python", good]) == 0
    (row,) = [r for r in json.loads(out.read_text())["rows"] if r["metric"] == "tpot_ms"]
    assert row["detail"]["sglang_pool"]["slots"] == 16_384 and row["detail"]["sglang_pool"]["rows"] == 16_384 + 64
    assert "--max-total-tokens" in row["detail"]["command"]


@pytest.mark.parametrize("extra, fragment", [
    (["--slots", "16400"], "64-token pages"),  # SGLang rounds a pool down to whole pages: 16,384, not 16,400
    (["--slots", "4096"], "4,128 slots"),  # one_batch skips a batch that does not fit: 1 x (4096 + 32)
])
def test_cli_engine_sglang_refuses_a_pool_sglang_cannot_build_as_asked_before_running_it(tmp_path, capsys, extra, fragment):
    from harness.cli import main

    marker = tmp_path / "ran"
    python = _fake_python(tmp_path, f"open({str(marker)!r}, 'w').close()\n" + sglang_pool() + f"print({one_batch_log(1, [0.03] * 31)!r})")
    argv = ["tpot", "--device", "cpu", "--engine", "sglang", "--sglang-python", python, "--sglang-workdir", str(tmp_path / "w"),
            "--strategy", "stock"]
    assert main([*argv, *extra]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --slots") and fragment in line, line
    assert not marker.exists()  # refused before SGLang ran
