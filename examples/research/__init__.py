"""The ``research`` example pipeline over a small document set (see README.md here)."""
