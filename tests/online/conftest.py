"""Make online_helpers.py importable from the online tests under --import-mode=importlib; run
each online test on one torch thread (these models are tiny: more threads only contend on a
shared machine) and restore the thread count afterwards."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
