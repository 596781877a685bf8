import sys

from ci.experiments.isolation.isolation import main

sys.exit(main())
