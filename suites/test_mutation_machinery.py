"""The mutation tests' own twin: a planted change that no test catches must fail `assert_caught`."""

import pytest

from suites.mutation import assert_caught

MUTATIONS = [("harmless", "harness/spec/faults.py", "NAN_CODE = 0x7F", "NAN_CODE = 0x7F  # unchanged", ["suites/test_guards.py"])]


def test_an_uncaught_mutation_fails_the_check(tmp_path):
    with pytest.raises(AssertionError, match=r"mutations not caught: \['harmless'\]"):
        assert_caught(__name__, MUTATIONS, tmp_path)
