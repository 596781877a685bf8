import sys

from ci.experiments.sglang_gate.sglang_gate import main

sys.exit(main())
