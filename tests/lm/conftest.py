"""Make lm_helpers.py and the scripts beside it importable under --import-mode=importlib."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
