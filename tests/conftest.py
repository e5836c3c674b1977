import pytest

from locatdino.data import ScenesSegmentation
from locatdino.evaluation.splits import CachedSplit
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model
from tests.process_state import restore_module_state, restore_process_state  # noqa: F401 - autouse, every test


@pytest.fixture(scope="session")
def scenes():
    """(train, val) built-in scenes at 96 px, decoded once: 16 memory and 6 query images."""
    return (
        CachedSplit(ScenesSegmentation(16, size=96, seed=0, split="train")),
        CachedSplit(ScenesSegmentation(6, size=96, seed=0, split="val")),
    )


@pytest.fixture(scope="session")
def tiny_vit():
    return tiny_vit_model()
