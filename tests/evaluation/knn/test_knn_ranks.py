"""``locatdino knn`` on 2 CPU ranks started by torchrun gives one process's numbers, and rank 0 alone writes."""

import pytest

from tests.evaluation.ranks_fixtures import SCENE_OPTIONS, one_and_two_ranks, torchrun

KNN = [
    "knn",
    "--model",
    "vit_tiny_patch16_224",
    *SCENE_OPTIONS,
    "--neighbours",
    "1",
    "3",
    "10",
    "--workers",
    "0",
    "--no-progress",
]


@pytest.mark.slow
def test_two_ranks_score_what_one_process_scores(tmp_path):
    one, two, done = one_and_two_ranks(KNN, tmp_path)
    assert two["data"] == one["data"] and two["config"] == one["config"]
    # the ranks' class tokens differ from one process's in the last float bits (other batches, one
    # thread each): a neighbour vote could flip only at a tie that close, so the scores agree to an image
    for k, scores in one["scores"].items():
        for metric in ("top1", "top5"):
            values = [scores[metric]["value"], two["scores"][k][metric]["value"]]
            assert values == [None, None] or abs(values[1] - values[0]) <= 100 / 9 + 1e-9, (k, metric)
    assert done.stdout.count("| vit_tiny_patch16_224 | k=1 |") == 1  # rank 0 alone prints the table
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    again = torchrun(2, "-m", "locatdino", *KNN, "--out", str(tmp_path / "two"))  # rank 0 refuses the folder
    refusal = f"locatdino knn: --out {tmp_path / 'two'} holds the output of an earlier run"
    assert again.returncode != 0 and again.stderr.count(refusal) == 2  # both ranks stop with it, none waits
