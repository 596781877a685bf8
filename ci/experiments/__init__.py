"""Experiments: one-off GPU measurements whose results back the evidence in docs/evidence.md.

Each lives in its own folder with one entry point, run from the checkout root as
`python -m ci.experiments.<name>`; nothing in the workflows, `.ci/run` or asv calls them.
"""
