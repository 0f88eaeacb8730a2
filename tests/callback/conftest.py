"""Make the callback tests' shared helpers (cl_helpers.py) importable under --import-mode=importlib."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
