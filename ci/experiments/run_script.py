"""The entry point of an experiment that is a shell script: `python -m ci.experiments.<name>` runs
its folder's run.sh from the checkout root (the script uses the checkout's relative paths);
`-h` / `--help` prints the usage, run.sh's header comment."""

import subprocess
import sys
from pathlib import Path


def run_script(main_file: str) -> int:
    script = Path(main_file).with_name("run.sh")
    if {"-h", "--help"} & set(sys.argv[1:]):
        for line in script.read_text().splitlines()[1:]:
            if not line.startswith("#"):
                break
            print(line[2:])
        return 0
    return subprocess.call(["bash", str(script), *sys.argv[1:]], cwd=Path(__file__).resolve().parents[2])
