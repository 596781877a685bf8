import subprocess
import sys
from pathlib import Path

script = Path(__file__).with_name("run.sh")
if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is run.sh's header comment
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        print(line[2:])
    sys.exit(0)
# run.sh from the checkout root (it uses the checkout's relative paths)
sys.exit(subprocess.call(["bash", str(script), *sys.argv[1:]], cwd=Path(__file__).resolve().parents[3]))
