"""Fixtures shared by the DINO tests (helpers live in ssl_helpers.py)."""

import pytest
import torch

import locatdino  # noqa: F401  (registers locatvit_*)


@pytest.fixture(autouse=True)
def one_thread():
    """2 cores shared by several jobs: intra-op threads spin against each other (50× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
