import pytest

from tests.data.data_fixtures import write_id_shards


@pytest.fixture
def id_shards(tmp_path):
    return write_id_shards(tmp_path / "ids", [7, 3, 9, 5, 6])  # 30 samples, uneven shards
