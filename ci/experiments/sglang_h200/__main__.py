from ci.experiments.sglang_h200.sglang_h200 import main

raise SystemExit(main())
