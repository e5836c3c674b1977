"""``locatdino compare`` on 2 CPU ranks started by torchrun gives one process's numbers, the baselines
included, and rank 0 alone writes the results, the figures and the per-image files."""

import pytest

from tests.evaluation.compare.test_runner import TINY
from tests.evaluation.ranks_fixtures import one_and_two_ranks

COMPARE = ["compare", "--model", "vit=vit_tiny_patch16_224", "--baselines", "--precision", "fp32", *TINY]


@pytest.mark.slow
def test_two_ranks_compare_what_one_process_compares(tmp_path):
    one, two, done = one_and_two_ranks(COMPARE, tmp_path)
    # in fp32 the ranks' features differ from one process's in the last float bits at most (one thread
    # per rank): a label or a neighbour vote could change only at a tie that close, so the scores
    # agree to the report's two decimals
    for key, metric in [("hbird", "miou"), ("hbird", "miou_matched"), ("linprobe", "miou"), ("probes", "knn_top1")]:
        assert round(two[key][metric], 2) == round(one[key][metric], 2), (key, metric)
    assert two["hbird"]["memory_patches"] == one["hbird"]["memory_patches"]
    assert done.stdout.count("| vit |") == 1  # rank 0 alone prints the table
    files = [sorted(p.relative_to(tmp_path / out) for p in (tmp_path / out).rglob("*")) for out in ("one", "two")]
    assert files[1] == files[0] and len(files[0]) > 4  # results, report, figures and per-image files, once
