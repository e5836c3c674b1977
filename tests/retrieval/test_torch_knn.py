import faiss
import numpy as np
import pytest
import torch

from locatdino.retrieval.torch_knn import TorchExactSearch


def _unit(n, d, seed):
    x = torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)
    return x.numpy()


def _faiss_flat(memory, queries, k):
    """The independent reference: FAISS IndexFlatIP on the same (float32-converted) features."""
    index = faiss.IndexFlatIP(memory.shape[1])
    index.add(memory.astype(np.float32))
    return index.search(queries, k)


@pytest.mark.parametrize(("stored", "search_dtype"), [
    (np.float32, torch.float32), (np.float32, torch.bfloat16), (np.float16, torch.float16),
], ids=["fp32", "fp32 memory, bf16 coarse pass", "fp16 memory and pass"])
@pytest.mark.parametrize(("query_chunk", "memory_chunk"), [(4096, 32768), (37, 101), (50, 7)],
                         ids=["one chunk", "ragged chunks", "memory chunks smaller than k"])
def test_same_neighbours_and_scores_as_faiss_flat(stored, search_dtype, query_chunk, memory_chunk):
    memory, queries, k = _unit(2000, 32, 0).astype(stored), _unit(120, 32, 1), 30
    search = TorchExactSearch(memory, "cpu", search_dtype, query_chunk=query_chunk, memory_chunk=memory_chunk)
    sims, ids = search.search(queries, k)
    ref_sims, ref_ids = _faiss_flat(memory, queries, k)
    assert sims.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (120, k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(sims, ref_sims, atol=1e-5)


def test_read_only_memory_map_is_searched_in_place(tmp_path):
    memory = _unit(500, 16, 2).astype(np.float16)
    path = tmp_path / "features.bin"
    memory.tofile(path)
    mapped = np.memmap(path, dtype=np.float16, mode="r", shape=memory.shape)
    search = TorchExactSearch(mapped, "cpu", memory_chunk=64)
    assert search.memory.dtype == torch.float16 and search.ntotal == 500
    assert search.memory.data_ptr() == mapped.ctypes.data  # not copied
    queries = _unit(10, 16, 3)
    np.testing.assert_array_equal(search.search(queries, 5)[1], _faiss_flat(memory, queries, 5)[1])


def test_writable_float32_memory_is_shared_not_copied():
    memory = _unit(100, 8, 4)
    assert TorchExactSearch(memory).memory.data_ptr() == memory.ctypes.data


def test_clear_errors():
    with pytest.raises(ValueError, match=r"float32/float16 features \[N, D\], got float64 \(10, 8\)"):
        TorchExactSearch(np.zeros((10, 8)))
    with pytest.raises(ValueError, match="k=11 neighbours requested but the memory holds 10"):
        TorchExactSearch(_unit(10, 8, 0)).search(_unit(2, 8, 1), 11)
