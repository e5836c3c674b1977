import decimal

import numpy as np
import pytest
import torch

from locatdino.evaluation.knn_classifier import knn_classify, topk_hits


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


def exact_rankings(train, train_labels, test, k, temperature, num_classes):
    """Each test row's classes ranked by summed vote exp(sim / T) in 60-digit decimal arithmetic
    (no overflow, no underflow), ties and unvoted classes by id; the similarities in float64."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    rankings, gaps = [], []
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        for row in test.astype(np.float64) @ train.astype(np.float64).T:
            votes = [decimal.Decimal(0)] * num_classes
            for j in np.argsort(-row, kind="stable")[:k]:
                votes[train_labels[j]] += (decimal.Decimal(float(row[j])) / decimal.Decimal(temperature)).exp()
            order = sorted(range(num_classes), key=lambda c: (-votes[c], c))
            rankings.append(order[:5])
            voted = [votes[c].ln() for c in order[:5] if votes[c] > 0]
            gaps += [float(a - b) for a, b in zip(voted, voted[1:])]
    return np.array(rankings), min(gaps)


@pytest.mark.parametrize("temperature", [0.005, 1e-4, 0.07])
def test_small_temperatures_rank_classes_as_exact_arithmetic_does(temperature):
    """At T = 0.005 exp(sim / T) is infinite in float32 (every class tied: the lowest id won); at
    T = 1e-4 a class behind the best by 0.1 in cosine has exp(-1000) of its vote, zero even in
    float64: each class keeps its own vote, ranked as the exact sum ranks it."""
    train, train_labels = _clusters(40, 8, 6, seed=4, spread=0.8)
    test, _ = _clusters(25, 8, 6, seed=5, spread=0.8)
    found = knn_classify(
        torch.from_numpy(train),
        torch.from_numpy(train_labels),
        torch.from_numpy(test),
        (40,),
        temperature,
        num_classes=8,
    )[40]
    expected, gap = exact_rankings(train, train_labels, test, 40, temperature, 8)
    assert gap > 1e-6 / temperature * 100  # float32 similarities (off by ~1e-7) cannot reorder the exact ranking
    np.testing.assert_array_equal(found.numpy(), expected)
    if temperature < 0.01:  # the reference's float32 vote cannot tell these classes apart
        with np.errstate(over="ignore"):
            reference = float32_vote_rankings(train, train_labels, test, 40, temperature, 8)
        assert (reference[:, 0] != expected[:, 0]).sum() > 5


def float32_vote_rankings(train, train_labels, test, k, temperature, num_classes):
    """DINO's knn_classifier's vote, in its arithmetic: float32 exp(sim / T) summed per class,
    classes sorted by it (ties by id); the top min(5, C)."""
    train = torch.nn.functional.normalize(torch.from_numpy(train), dim=1)
    test = torch.nn.functional.normalize(torch.from_numpy(test), dim=1)
    sims, ids = (test @ train.T).topk(k, dim=1)
    votes = torch.zeros(len(test), num_classes).scatter_add_(
        1, torch.from_numpy(train_labels)[ids], (sims / temperature).exp()
    )
    return torch.sort(votes, dim=1, descending=True, stable=True).indices[:, : min(5, num_classes)].numpy()


@pytest.mark.parametrize(("temperature", "k"), [(0.07, 20), (0.5, 7), (0.02, 50)])
def test_where_the_reference_does_not_overflow_its_ranking_is_kept(temperature, k):
    """The log-domain vote changes nothing where float32 exp(sim / T) is finite: the same five
    classes in the same order for every test row."""
    train, train_labels = _clusters(600, 12, 16, seed=0)
    test, _ = _clusters(150, 12, 16, seed=1)
    found = knn_classify(
        torch.from_numpy(train),
        torch.from_numpy(train_labels),
        torch.from_numpy(test),
        (k,),
        temperature,
        num_classes=12,
    )[k]
    np.testing.assert_array_equal(found.numpy(), float32_vote_rankings(train, train_labels, test, k, temperature, 12))


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
        ((5,), 0.0, "temperature must be > 0 with cos / T finite in float64 .*, got 0.0"),
        ((5,), 1e-320, r"temperature must be > 0 with cos / T finite in float64 \(T >= 1.11e-308\), got 1e-320"),
    ],
)
def test_unusable_settings_are_named(ks, temperature, message):
    with pytest.raises(ValueError, match=message):
        knn_classify(torch.randn(10, 4), torch.arange(10) % 2, torch.randn(3, 4), ks, temperature)
