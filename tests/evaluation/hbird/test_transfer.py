import math

import torch

from locatdino.evaluation.hbird.transfer import predict, transfer_labels


def test_hand_built_memory_gives_hand_computed_scores():
    # memory of 3 patches, 2 classes; one query whose k=3 neighbours have cos 0.9, 0.8, 0.5
    labels = torch.tensor([[1.0, 0.0], [0.25, 0.75], [0.0, 1.0]])
    sims = torch.tensor([[0.9, 0.8, 0.5]])
    scores = transfer_labels(sims, labels.unsqueeze(0), beta=0.02)
    e = [math.exp(s / 0.02) for s in (0.9, 0.8, 0.5)]
    w = [x / sum(e) for x in e]
    expected = [w[0] * 1 + w[1] * 0.25, w[1] * 0.75 + w[2] * 1]
    assert torch.allclose(scores, torch.tensor([expected]), atol=1e-6)
    # beta -> large: plain average of the three soft labels
    flat = transfer_labels(sims, labels.unsqueeze(0), beta=1e6)
    assert torch.allclose(flat, labels.mean(0, keepdim=True), atol=1e-5)


def test_missing_neighbours_get_no_weight():
    labels = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    sims = torch.tensor([[0.3, -3.4e38], [-3.4e38, -3.4e38]])
    scores = transfer_labels(sims, labels)
    assert torch.equal(scores, torch.tensor([[0.0, 1.0], [0.0, 0.0]]))


def test_predict_upsamples_bilinearly_then_argmax():
    # 2x2 grid: class 1 wins in the left column only
    scores = torch.tensor([[[[0.2, 0.8], [0.2, 0.8]], [[0.8, 0.2], [0.8, 0.2]]]])
    pred = predict(scores, (4, 8))
    assert pred.shape == (1, 4, 8)
    assert pred[0, :, :4].eq(1).all() and pred[0, :, 4:].eq(0).all()
