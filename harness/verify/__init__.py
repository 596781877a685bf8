"""Checking outputs: tolerance policy and verdicts, goldens, negative controls."""
