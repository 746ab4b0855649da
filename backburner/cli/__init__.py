"""The ``backburner`` command line. Errors print one line and exit non-zero."""

from .main import build_cli, main

__all__ = ["build_cli", "main"]
