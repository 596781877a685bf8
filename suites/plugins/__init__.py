"""pytest plugins of the suites, registered from the root conftest.py."""
