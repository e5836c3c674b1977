"""One rank of the 2-rank Hummingbird test (``test_hbird_ranks.py``), started by torchrun: builds the
memory of its share of the views, joins confusion matrices of its share of the images and takes rank
0's copy of a module, and saves what it got as ``OUT/rank<r>.npz``."""

import sys
from pathlib import Path

import numpy as np
import torch

from locatdino.evaluation import ranks
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import build_memory
from locatdino.evaluation.metric import gather_confusions
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model
from tests.evaluation.hbird.shares_fixtures import CONFUSION_IMAGES, budget_config, confusions_of, memory_scenes


def main(out: Path) -> None:
    with ranks.evaluation_ranks() as launch:
        bank, skipped = build_memory(
            FeatureExtractor(tiny_vit_model()), memory_scenes(), budget_config(memory_dtype="float16"), shared=True
        )
        cm = gather_confusions(confusions_of(launch.share(CONFUSION_IMAGES)))
        module = torch.nn.Linear(3, 2)
        torch.nn.init.constant_(module.weight, float(launch.rank + 1))
        ranks.broadcast_module(module)
        np.savez(
            out / f"rank{launch.rank}.npz",
            features=bank.features,
            labels=bank.labels,
            skipped=skipped,
            matrix=cm.matrix.numpy(),
            images=cm.images.dense(),
            weight=module.weight.detach().numpy(),
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
