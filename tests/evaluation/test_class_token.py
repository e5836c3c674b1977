import numpy as np
import pytest
import torch

from locatdino.evaluation.class_token import class_embeddings, knn_accuracy, logistic_accuracy


def naive_knn(train, train_labels, test, k, temperature):
    """DINO's weighted k-NN written with loops: cosine top-k, votes exp(sim / T), argmax."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    predictions = []
    for x in test:
        sims = train @ x
        votes = {}
        for j in np.argsort(-sims)[:k]:
            votes[train_labels[j]] = votes.get(train_labels[j], 0.0) + np.exp(sims[j] / temperature)
        predictions.append(max(sorted(votes), key=lambda c: votes[c]))
    return np.array(predictions)


def test_one_hot_class_indicators_are_classified_perfectly():
    rng = np.random.default_rng(0)
    train_labels, test_labels = rng.integers(0, 5, 60), rng.integers(0, 5, 40)
    eye = np.eye(5)
    assert knn_accuracy(eye[train_labels], train_labels, eye[test_labels], test_labels) == 1.0
    assert logistic_accuracy(eye[train_labels], train_labels, eye[test_labels], test_labels) == 1.0


def test_shuffled_train_labels_give_chance():
    rng = np.random.default_rng(1)
    classes = 4
    train_labels, test_labels = rng.integers(0, classes, 2000), rng.integers(0, classes, 1000)
    centres = 3 * np.eye(classes, 16)
    train = centres[train_labels] + rng.normal(size=(2000, 16))
    test = centres[test_labels] + rng.normal(size=(1000, 16))
    assert knn_accuracy(train, train_labels, test, test_labels) > 0.9  # the features do carry the class
    shuffled = rng.permutation(train_labels)
    assert abs(knn_accuracy(train, shuffled, test, test_labels) - 1 / classes) < 0.05
    assert abs(logistic_accuracy(train, shuffled, test, test_labels) - 1 / classes) < 0.05


@pytest.mark.parametrize("k, temperature", [(5, 0.07), (20, 0.07), (3, 1.0)])
def test_knn_matches_a_naive_implementation(k, temperature):
    rng = np.random.default_rng(2)
    train, test = rng.normal(size=(80, 8)), rng.normal(size=(30, 8))
    train_labels, test_labels = rng.integers(0, 3, 80), rng.integers(0, 3, 30)
    expected = np.mean(naive_knn(train, train_labels, test, k, temperature) == test_labels)
    assert knn_accuracy(train, train_labels, test, test_labels, k=k, temperature=temperature) == pytest.approx(expected)


def test_bad_shapes_name_the_problem():
    with pytest.raises(ValueError, match="features but"):
        knn_accuracy(np.zeros((3, 2)), np.zeros(2), np.zeros((1, 2)), np.zeros(1))


def test_class_embeddings_are_the_image_embedding(tiny_vit):
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    emb = class_embeddings(tiny_vit, images, batch_size=2)
    from locatdino.evaluation.augment import normalize

    with torch.no_grad():
        expected = tiny_vit(normalize(images)).numpy()
    assert emb.shape == (5, 64)
    np.testing.assert_allclose(emb, expected, rtol=1e-4, atol=1e-5)
