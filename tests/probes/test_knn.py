import numpy as np
import pytest
import torch

from locatdino.probes.knn import knn_classify, topk_hits


def dino_knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes):
    """facebookresearch/dino's knn_classifier as docs/evaluation.md describes it, written plainly: the whole
    [M, N] cosine matrix, top k, one-hot votes weighted exp(sim / T), classes sorted by vote;
    returns top-1 and top-5 (over min(5, k) ranks) as counts of test images."""
    train = train_features / np.linalg.norm(train_features, axis=1, keepdims=True)
    test = test_features / np.linalg.norm(test_features, axis=1, keepdims=True)
    similarity = test @ train.T
    top1 = top5 = 0
    for row, target in zip(similarity, test_labels):
        nearest = np.argsort(-row, kind="stable")[:k]
        probs = np.zeros(num_classes)
        for j in nearest:
            probs[train_labels[j]] += np.exp(row[j] / T)
        predictions = np.argsort(-probs, kind="stable")
        top1 += int(predictions[0] == target)
        top5 += int(target in predictions[: min(5, k)])
    return top1, top5


def _clusters(n, classes, dim, seed, spread=1.5):
    """Features that carry their class (so the vote matters) but overlap (so it is not trivial)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(size=(classes, dim))
    labels = rng.integers(0, classes, n)
    return (centres[labels] + spread * rng.normal(size=(n, dim))).astype(np.float32), labels


@pytest.mark.parametrize("backend", ["torch", "faiss"])
@pytest.mark.parametrize(
    ("ks", "temperature", "classes", "chunks"),
    [
        ((10, 20, 100, 200), 0.07, 12, (64, 100)),
        ((1, 3, 7), 0.5, 9, (1000, 1000)),
        ((20,), 0.07, 3, (17, 33)),
    ],
    ids=["dino defaults, ragged chunks", "small k, one chunk", "fewer classes than top-5"],
)
def test_top1_top5_are_those_of_dinos_knn_classifier(backend, ks, temperature, classes, chunks):
    train, train_labels = _clusters(600, classes, 16, seed=0)
    test, test_labels = _clusters(150, classes, 16, seed=1)
    rankings = knn_classify(
        torch.from_numpy(train),
        torch.from_numpy(train_labels),
        torch.from_numpy(test),
        ks,
        temperature,
        num_classes=classes,
        backend=backend,
        query_chunk=chunks[0],
        memory_chunk=chunks[1],
    )
    assert sorted(rankings) == sorted(ks)
    labels = torch.from_numpy(test_labels)
    for k in ks:
        assert rankings[k].shape == (150, min(5, classes)) and rankings[k].dtype == torch.int64
        expected = dino_knn_classifier(train, train_labels, test, test_labels, k, temperature, classes)
        found = (int(topk_hits(rankings[k], labels, 1).sum()), int(topk_hits(rankings[k], labels, min(5, k)).sum()))
        assert found == expected
        assert 0 < expected[0] < 150  # neither trivial nor hopeless: the comparison can fail


def test_one_search_serves_every_k():
    """A k's ranking from the shared max(ks) search is the ranking of a search at that k alone."""
    train, train_labels = _clusters(300, 6, 8, seed=2)
    test, _ = _clusters(50, 6, 8, seed=3)
    args = torch.from_numpy(train), torch.from_numpy(train_labels), torch.from_numpy(test)
    together = knn_classify(*args, ks=(5, 40, 200))
    for k in (5, 40, 200):
        assert torch.equal(together[k], knn_classify(*args, ks=(k,))[k])


def test_ties_rank_the_smallest_class_first_and_unvoted_classes_follow():
    train = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    rankings = knn_classify(train, torch.tensor([3, 1, 0]), torch.tensor([[1.0, 0.0]]), ks=(2,), num_classes=6)
    assert rankings[2].tolist() == [[1, 3, 0, 2, 4]]  # 1 and 3 tie; 0, 2, 4 got no vote


def test_topk_hits_counts():
    rankings = torch.tensor([[2, 0, 1], [1, 2, 0], [0, 1, 2]])
    labels = torch.tensor([0, 1, 2])
    assert topk_hits(rankings, labels, 1).tolist() == [False, True, False]
    assert topk_hits(rankings, labels, 2).tolist() == [True, True, False]
    assert topk_hits(rankings, labels, 5).tolist() == [True, True, True]


@pytest.mark.parametrize(
    ("ks", "temperature", "message"),
    [
        ((11,), 0.07, "k=11 neighbours asked for but the train set holds 10 images"),
        ((0, 5), 0.07, "k must be at least 1"),
        ((5,), 0.0, "temperature must be > 0, got 0.0"),
    ],
)
def test_unusable_settings_are_named(ks, temperature, message):
    with pytest.raises(ValueError, match=message):
        knn_classify(torch.randn(10, 4), torch.arange(10) % 2, torch.randn(3, 4), ks, temperature)
