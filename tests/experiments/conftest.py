"""Make experiment_helpers.py importable from the experiment tests under --import-mode=importlib."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
