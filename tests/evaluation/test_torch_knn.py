import faiss
import numpy as np
import pytest
import torch

import locatdino.evaluation.torch_knn as torch_knn
from benchmarks.speed.torch_knn_recall import clustered  # the benchmark's memories, smaller
from locatdino.evaluation.torch_knn import TorchExactSearch


def _unit(n, d, seed):
    x = torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)
    return x.numpy()


def _faiss_flat(memory, queries, k):
    """The independent reference: FAISS IndexFlatIP on the same (float32-converted) features."""
    index = faiss.IndexFlatIP(memory.shape[1])
    index.add(memory.astype(np.float32))
    return index.search(queries, k)


@pytest.mark.parametrize(
    ("stored", "search_dtype"),
    [
        (np.float32, torch.float32),
        (np.float32, torch.bfloat16),
        (np.float16, torch.float16),
    ],
    ids=["fp32", "fp32 memory, bf16 coarse pass", "fp16 memory and pass"],
)
@pytest.mark.parametrize(
    ("query_chunk", "memory_chunk"),
    [(4096, 32768), (37, 101), (50, 7)],
    ids=["one chunk", "ragged chunks", "memory chunks smaller than k"],
)
def test_same_neighbours_and_scores_as_faiss_flat(stored, search_dtype, query_chunk, memory_chunk):
    memory, queries, k = _unit(2000, 32, 0).astype(stored), _unit(120, 32, 1), 30
    search = TorchExactSearch(memory, "cpu", search_dtype, query_chunk=query_chunk, memory_chunk=memory_chunk)
    sims, ids = search.search(queries, k)
    ref_sims, ref_ids = _faiss_flat(memory, queries, k)
    assert sims.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (120, k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(sims, ref_sims, atol=1e-5)


@pytest.mark.parametrize("search_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("max_width", [4096, 64], ids=["wider passes", "float32 pass past 64 candidates"])
def test_half_precision_pass_is_exact_on_clustered_memories(monkeypatch, search_dtype, max_width):
    monkeypatch.setattr(torch_knn, "_MAX_WIDTH", max_width)
    data, k = clustered(4050, 64, 20, 0.999, 5), 30  # near-duplicate patches of 20 regions
    memory, queries = data[:4000], data[4000:]
    half = torch.from_numpy(queries).to(search_dtype) @ torch.from_numpy(memory).to(search_dtype).T
    ref_sims, ref_ids = _faiss_flat(memory, queries, k)
    half_recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(half.float().topk(k).indices.numpy(), ref_ids)])
    assert half_recall < 0.8  # near-duplicates: half-precision scores alone lose true neighbours

    sims, ids = TorchExactSearch(memory, "cpu", search_dtype, query_chunk=16, memory_chunk=700).search(queries, k)
    exact = queries.astype(np.float64) @ memory.astype(np.float64).T
    for row, (got, want) in enumerate(zip(ids, ref_ids)):  # same neighbours up to ties at fp32 resolution
        assert len(set(got)) == k
        np.testing.assert_allclose(np.sort(exact[row, got]), np.sort(exact[row, want]), rtol=0, atol=3e-7)
    assert np.mean(ids == ref_ids) > 0.9
    np.testing.assert_allclose(sims, ref_sims, atol=1e-6)


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
