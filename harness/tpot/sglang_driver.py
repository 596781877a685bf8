"""`harness tpot --engine sglang`: SGLang's one-batch benchmark on a config-only model folder, with
the strategy installed into SGLang (harness/tpot/sglang_plugin.py), every decode step's latency (its
`--log-decode-step 1` log lines) parsed into the results JSON as samples, so `compare` can gate them.
Needs SGLang on a GPU box; this driver has not run on a GPU here.

The folder holds only config.json (weights are SGLang's `--load-format dummy`), FP8 block-quantized
as the real checkpoints. `one_rank` shrinks the model to one TP rank through
`--json-model-override-args` (heads, FFN/MoE intermediates and vocab divided by tp) and runs tp 1.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.fsio import check_new_dir
from harness.tpot.config import ModelShape

# GLM-5's DSA indexer fields: assumed (DeepSeek-V3.2's values), not read from GLM-5's own config
DSA_INDEXER = {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
# A DSA model's pool rows are raw 576-byte FP8 rows only with the trtllm DSA backends (sglang 0.5.23
# calculate_mla_kv_cache_dim; its defaults, flashmla_kv on SM90 and flashinfer_sparse_mla for GLM-5 on
# SM12x, store 656-byte rows with block scales): the deployment the harness models (docs/correctness.md#scope)
DSA_RAW_ROWS = ["--dsa-prefill-backend", "trtllm", "--dsa-decode-backend", "trtllm"]
DECODE_LINE = re.compile(r"Decode\.\s+median latency:\s*([0-9.eE+-]+)\s*s")
# sglang 0.5.23 one_batch.latency_test_run_once, per step with --log-decode-step 1; its warmup run logs
# steps 0-4 before the "Benchmark ..." line, so only the lines after the last one are the measured run's
BENCHMARK_LINE = "Benchmark ..."
STEP_LINE = re.compile(r"^Decode (\d+)\. Batch size: (\d+), latency: ([0-9.eE+-]+) s", re.MULTILINE)


def model_config(shape: ModelShape) -> dict:
    """config.json of the full model (as the public checkpoint describes it)."""
    arch, model_type = shape.architecture, shape.model_type  # models.toml: what SGLang serves it as
    cfg = {
        "architectures": [arch], "model_type": model_type, "torch_dtype": "bfloat16",
        "hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers, "first_k_dense_replace": shape.first_k_dense,
        "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_heads,
        "q_lora_rank": shape.q_lora_rank, "kv_lora_rank": shape.kv_lora_rank,
        "qk_nope_head_dim": shape.qk_nope_head_dim, "qk_rope_head_dim": shape.qk_rope_head_dim, "v_head_dim": shape.v_head_dim,
        "n_routed_experts": shape.n_routed_experts, "num_experts_per_tok": shape.num_experts_per_tok,
        "n_shared_experts": shape.n_shared_experts, "moe_intermediate_size": shape.moe_intermediate_size,
        "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
        "n_group": shape.n_group, "topk_group": shape.topk_group, "routed_scaling_factor": shape.routed_scaling_factor,
        "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }
    if model_type == "glm_moe_dsa":
        cfg.update(DSA_INDEXER)
    return cfg


def one_rank_overrides(shape: ModelShape) -> dict:
    """Fields that make a tp-1 model the size of one rank of the tp-`shape.tp` deployment."""
    return {"num_attention_heads": shape.heads, "num_key_value_heads": shape.heads,
            "moe_intermediate_size": shape.moe_inter, "intermediate_size": shape.dense_inter, "vocab_size": shape.vocab}


WORKDIR_MARK = ".mla-harness-sglang-workdir"  # in a --sglang-workdir the driver made: its files there are its own


def check_workdir(workdir: Path) -> None:
    """Before any work: --sglang-workdir is new, empty or one the driver made (its mark), so the model's
    config.json and the result files it replaces are never a user's (`run` marks it)."""
    check_new_dir(workdir, "--sglang-workdir")
    if workdir.is_dir() and any(workdir.iterdir()) and not (workdir / WORKDIR_MARK).is_file():
        raise HarnessError("--sglang-workdir", f"{workdir} holds files the harness did not write; they are kept "
                           "(choose a new or empty folder)")


def write_model_folder(shape: ModelShape, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(shape), indent=1) + "\n")
    return folder


def one_batch_args(folder: Path, shape: ModelShape, batch_size: int, input_len: int, output_len: int,
                   result_file: Path, one_rank: bool = True) -> list[str]:
    """Arguments of `python -m sglang.benchmark.one_batch` (sglang 0.5.23's bench_one_batch)."""
    args = ["--model-path", str(folder), "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3",
            "--attention-backend", "flashinfer", "--skip-tokenizer-init", "--trust-remote-code",
            "--batch-size", str(batch_size), "--input-len", str(input_len), "--output-len", str(output_len),
            "--result-filename", str(result_file), "--log-decode-step", "1"]
    if shape.preset.index_k_bytes:  # a DSA model
        args += DSA_RAW_ROWS
    if one_rank:
        args += ["--tp-size", "1", "--json-model-override-args", json.dumps(one_rank_overrides(shape))]
    else:
        args += ["--tp-size", str(shape.tp)]
    return args


def launch_command(python: str, strategy: str, args: list[str]) -> list[str]:
    return [python, "-m", "harness.tpot.sglang_launch", "--strategy", strategy, "--", *args]


def parse_decode_ms(result_file: Path, stdout: str) -> float:
    """Median decode latency in ms: from the benchmark's result JSONL, else from its log line."""
    if result_file.exists():
        for line in reversed(result_file.read_text().splitlines()):
            try:
                value = json.loads(line).get("median_decode_latency")
            except (json.JSONDecodeError, AttributeError):
                continue
            if value is not None:
                return float(value) * 1e3
    found = DECODE_LINE.findall(stdout)
    if not found:
        raise HarnessError("sglang one_batch", f"no decode latency in {result_file} or the log")
    return float(found[-1]) * 1e3


def parse_step_ms(stdout: str, batch_size: int, output_len: int) -> list[float]:
    """Each measured decode step's latency in ms, in step order: the `Decode i.` lines after the last
    "Benchmark ..." line, which must be steps 0..output_len-2 of `batch_size` requests (SGLang times
    output_len - 1 decode steps and takes their median)."""
    if BENCHMARK_LINE not in stdout:
        raise HarnessError("sglang one_batch", f"no {BENCHMARK_LINE!r} line in its log: not sglang.benchmark.one_batch's output")
    steps = STEP_LINE.findall(stdout.rsplit(BENCHMARK_LINE, 1)[1])
    if [(int(i), int(b)) for i, b, _ in steps] != [(i, batch_size) for i in range(output_len - 1)]:
        raise HarnessError("sglang one_batch", f"its log has {len(steps)} decode step lines, not steps 0..{output_len - 2} of batch "
                                               f"{batch_size} (does this SGLang log every step with --log-decode-step 1?)")
    return [float(seconds) * 1e3 for _, _, seconds in steps]


def run(shape: ModelShape, strategy: str, batch_size: int, input_len: int, output_len: int, workdir: Path,
        python: str = sys.executable, one_rank: bool = True, timeout_s: int = 3600) -> dict:
    """Run the benchmark once for `strategy`: {step_ms (every decode step), tpot_ms (their median),
    sglang_median_ms (SGLang's own, unrounded), command, log_tail}."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARK).touch()
    folder = write_model_folder(shape, workdir / "model")
    result_file = workdir / f"one_batch-{strategy}.jsonl"
    result_file.unlink(missing_ok=True)
    cmd = launch_command(python, strategy, one_batch_args(folder, shape, batch_size, input_len, output_len, result_file, one_rank))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise HarnessError("sglang one_batch", f"exit {proc.returncode}: {log.strip().splitlines()[-1] if log.strip() else 'no output'}")
    steps = parse_step_ms(proc.stdout, batch_size, output_len)
    return {"step_ms": steps, "tpot_ms": statistics.median(steps), "sglang_median_ms": parse_decode_ms(result_file, log),
            "command": cmd, "log_tail": log[-2000:]}
