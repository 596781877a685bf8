"""`python -m harness.tpot.sglang_launch --strategy S [--slots N] -- ARGS`: install S into SGLang, then run
`sglang.benchmark.one_batch` with ARGS in this process (tp 1; with tp > 1 SGLang starts worker
processes that do not inherit the install unless they fork).

Once SGLang has built its KV pool (ModelRunner.alloc_memory_pool), the launcher prints one POOL_MARK
line: the pool as SGLang's own objects have it (slots, page size, rows and bytes of a layer buffer,
layers, class, the runner's max_total_num_tokens). With --slots N and a pool of another size it stops
there (exit 2), before any benchmark runs on a pool the results would mislabel; the driver
(harness/tpot/sglang_driver.py check_pool) reads the line either way."""

from __future__ import annotations

import argparse
import json
import sys

POOL_MARK = "mla-harness sglang pool: "
POOL_MISMATCH_EXIT = 2


def pool_report(runner) -> dict:
    """The KV pool of SGLang's ModelRunner `runner`, read from its objects (sglang 0.5.23: token_to_kv_pool is an
    MLATokenToKVPool / DSATokenToKVPool of `size` slots whose kv_buffer holds one [size + page_size, 1, row] tensor per layer)."""
    pool = runner.token_to_kv_pool
    buffers = list(getattr(pool, "kv_buffer", None) or [])
    first = buffers[0] if buffers else None
    return {"slots": int(pool.size), "page_size": int(pool.page_size),
            "rows": None if first is None else int(first.shape[0]),
            "row_bytes": None if first is None else int(first[0].numel() * first.element_size()),
            "layers": len(buffers), "pool": type(pool).__name__,
            "max_total_num_tokens": int(runner.max_total_num_tokens)}


def report_pool(expect_slots: int | None) -> None:
    """Make SGLang's ModelRunner.alloc_memory_pool print pool_report (and stop on a pool of other than `expect_slots`)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    alloc = ModelRunner.alloc_memory_pool

    def alloc_memory_pool(self, *args, **kwargs):
        out = alloc(self, *args, **kwargs)
        if getattr(self, "is_draft_worker", False):
            return out
        report = pool_report(self)
        print(POOL_MARK + json.dumps(report), flush=True)
        if expect_slots is not None and report["slots"] != expect_slots:
            print(f"mla-harness: SGLang built a {report['slots']:,}-slot KV pool, not the {expect_slots:,} asked for "
                  "(--max-total-tokens); stopped before the benchmark", file=sys.stderr, flush=True)
            raise SystemExit(POOL_MISMATCH_EXIT)
        return out

    ModelRunner.alloc_memory_pool = alloc_memory_pool


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m harness.tpot.sglang_launch")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--slots", type=int, default=None, help="the KV pool's token slots the run must have")
    args = parser.parse_args(argv[:split])
    from harness.tpot.sglang_plugin import install

    install(args.strategy)
    report_pool(args.slots)
    from sglang.benchmark.one_batch import cli_main

    sys.argv = ["sglang.benchmark.one_batch", *argv[split + 1 :]]
    cli_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
