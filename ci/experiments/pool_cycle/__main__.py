import sys

from ci.experiments.pool_cycle.pool_cycle import main

main(sys.argv[1] if len(sys.argv) > 1 else "glm5-tp8.ci.b1-l500")
