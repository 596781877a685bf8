"""`python -m harness.tpot.sglang_launch --strategy S -- ARGS`: install S into SGLang, then run
`sglang.benchmark.one_batch` with ARGS in this process (tp 1; with tp > 1 SGLang starts worker
processes that do not inherit the install unless they fork)."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m harness.tpot.sglang_launch")
    parser.add_argument("--strategy", required=True)
    args = parser.parse_args(argv[:split])
    from harness.tpot.sglang_plugin import install

    install(args.strategy)
    from sglang.benchmark.one_batch import cli_main

    sys.argv = ["sglang.benchmark.one_batch", *argv[split + 1 :]]
    cli_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
