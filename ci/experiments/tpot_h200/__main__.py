import subprocess
import sys
from pathlib import Path

# run.sh beside this file, from the checkout root (it uses the checkout's relative paths)
sys.exit(subprocess.call(["bash", str(Path(__file__).with_name("run.sh")), *sys.argv[1:]],
                         cwd=Path(__file__).resolve().parents[3]))
