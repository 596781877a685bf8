import sys

from ci.experiments.asv_gate.asv_gate import main

sys.exit(main())
