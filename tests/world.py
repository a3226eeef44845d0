"""The multi-process harness the tests use (it lives in the package: funcoll.launch)."""

from funcoll.launch import free_port, run_world  # noqa: F401
