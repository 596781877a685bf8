from ci.experiments.run_script import run_script

raise SystemExit(run_script(__file__))
