import sys

from ci.experiments.gate.gate import main

sys.exit(main())
