"""Shared test set-up: make the plain-loop references in tests/ importable, keep plots headless."""

import os
import sys

os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, os.path.dirname(__file__))
