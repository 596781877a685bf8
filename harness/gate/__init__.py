"""Judging two results files: the decision rule and `compare`."""
