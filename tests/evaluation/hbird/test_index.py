import numpy as np
import pytest
import torch

from locatdino.evaluation.hbird.index import PatchIndex


def _unit(n, d, seed):
    x = torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)
    return x.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["searched in place", "IndexFlatIP"])
def test_exact_neighbours_equal_torch_topk(dtype):
    memory, queries = _unit(2000, 32, 0).astype(dtype), _unit(100, 32, 1)
    index = PatchIndex(32, device="cpu").build(memory, chunk=512)  # float16: several add() chunks
    assert (index.index.ntotal == 0) == (dtype == np.float32)  # float32: no second copy in FAISS
    assert index.ntotal == 2000
    sims, ids = index.search(queries, 30)
    ref = torch.from_numpy(queries) @ torch.from_numpy(memory.astype(np.float32)).T
    ref_sims, ref_ids = ref.topk(30, dim=1)
    assert index.exact_scores
    assert np.array_equal(ids, ref_ids.numpy())
    np.testing.assert_allclose(sims, ref_sims.numpy(), atol=1e-5)


def test_ivf_visiting_every_cell_is_exact_and_pq_scores_are_flagged():
    memory, queries = _unit(3000, 16, 2), _unit(50, 16, 3)
    exact = PatchIndex(16).build(memory)
    ivf = PatchIndex(16, "IVF16,Flat", nprobe=16).build(memory)
    assert np.array_equal(ivf.search(queries, 10)[1], exact.search(queries, 10)[1])
    assert not PatchIndex(16, "IVF16,PQ4").exact_scores
    hnsw = PatchIndex(16, "HNSW16", ef_search=64).build(memory)
    pairs = zip(hnsw.search(queries, 10)[1], exact.search(queries, 10)[1])
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in pairs])
    assert recall > 0.9


def test_clear_errors():
    with pytest.raises(ValueError, match="invalid FAISS index spec 'IVFx'"):
        PatchIndex(8, "IVFx")
    with pytest.raises(ValueError, match="has no parameter 'nprobe'"):
        PatchIndex(8, "Flat", nprobe=4).build(_unit(10, 8, 0))
    with pytest.raises(ValueError, match="k=30 neighbours requested but the memory holds 10"):
        PatchIndex(8).build(_unit(10, 8, 0)).search(_unit(2, 8, 1), 30)
    with pytest.raises(ValueError, match=r"features \[N, 8\]"):
        PatchIndex(8).build(_unit(10, 4, 0))


def test_torch_backend_forced_gives_the_faiss_neighbours():
    memory, queries = _unit(1500, 24, 5), _unit(40, 24, 6)
    index = PatchIndex(24, backend="torch").build(memory)
    assert index.torch_device == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert index.ntotal == 1500 and index.exact_scores
    sims, ids = index.search(queries, 20)
    ref_sims, ref_ids = PatchIndex(24, backend="faiss").build(memory).search(queries, 20)
    assert np.array_equal(ids, ref_ids)
    np.testing.assert_allclose(sims, ref_sims, atol=1e-5)


def test_backend_selection(monkeypatch):
    from locatdino.evaluation.hbird import index as index_module

    def device(**kwargs):
        return PatchIndex(8, **kwargs).torch_device

    cuda = torch.device("cuda:1")
    monkeypatch.setattr(index_module, "faiss_gpu_available", lambda: False)
    assert device(torch_device=cuda) == cuda  # encoder on CUDA, no faiss-gpu: torch there
    assert device(torch_device="cpu") is None  # CPU encoder: FAISS
    assert device(torch_device=cuda, device="cpu") is None  # --index-device cpu
    assert device(torch_device=cuda, spec="IVF4,Flat") is None  # approximate: FAISS
    assert device(torch_device=cuda, backend="faiss") is None
    assert device(torch_device=cuda, backend="torch", device="cpu") == torch.device("cpu")
    monkeypatch.setattr(index_module, "faiss_gpu_available", lambda: True)
    assert device(torch_device=cuda) is None  # faiss-gpu present: FAISS on the GPU
    with pytest.raises(ValueError, match="exact search only.*'IVF4,Flat'"):
        PatchIndex(8, "IVF4,Flat", backend="torch")
    with pytest.raises(ValueError, match="k-NN backend must be one of"):
        PatchIndex(8, backend="cuda")
