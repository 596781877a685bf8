"""Adapters that run other projects' decode code (the installed SGLang) on the harness's pool and steps."""
