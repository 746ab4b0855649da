"""The ``research`` pipeline over this folder's documents (examples/research/README.md).

backburner serve examples.research.app:bb
"""

from __future__ import annotations

from pathlib import Path

from backburner import Backburner
from backburner.research import install_research

DOCS = Path(__file__).resolve().parent / "docs"

bb = Backburner()
install_research(bb, folder=DOCS)
