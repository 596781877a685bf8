"""Test infrastructure and suites of mla-harness (a package, so tests import `suites.helpers` and `suites.plugins`)."""
