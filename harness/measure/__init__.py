"""Timing a session: the one timing loop, clocks, the control copy, every metric of a run, the environment fingerprint."""
