"""One rank of the 2-rank evaluation test (tests/evaluation/test_ranks.py), started by torchrun:
gathers known rows, encodes its share of a labelled split and saves what it got as ``OUT/rank<r>.npz``;
the writer alone also writes ``OUT/written-by-<r>``."""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from locatdino.evaluation import ranks
from tests.evaluation.ranks_fixtures import TABLE_ROWS, kept_rows, labelled_scenes, tiny_encoder


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def main(out: Path) -> None:
    with ranks.evaluation_ranks() as launch:
        table = np.arange(TABLE_ROWS * 3, dtype=np.float32).reshape(TABLE_ROWS, 3)
        ranks.GATHER_CHUNK_BYTES = 2 * table.itemsize * 3  # 2 rows per collective: several rounds, a ragged last
        to_all = ranks.extract_shared(lambda share: table[kept_rows(share)], TABLE_ROWS)
        to_root = ranks.extract_shared(lambda share: table[kept_rows(share)], TABLE_ROWS, to_all=False)
        flags = ranks.gather_rows(np.array([i % 2 == 0 for i in kept_rows(launch.share(TABLE_ROWS))]))
        names = ranks.gather_objects([f"rank {launch.rank} item {i}" for i in range(launch.rank + 1)])
        ranks.GATHER_CHUNK_BYTES = 64 << 20
        from locatdino.evaluation.class_features import class_token_embeddings

        images, loaded = labelled_scenes(), []
        load = images.load
        images.load = lambda i: loaded.append(i) or load(i)  # which images this rank decoded
        with class_token_embeddings(
            tiny_encoder(), images, 32, batch_size=2, workers=0, show_progress=False, shared=True
        ) as emb:
            np.savez(
                out / f"rank{launch.rank}.npz",
                to_all=to_all,
                to_root=np.array([]) if to_root is None else to_root,
                root_got=to_root is not None,
                flags=flags,
                features=emb.features,
                labels=emb.labels,
                kept=emb.kept,
                world=launch.world_size,
                loaded=np.array(sorted(loaded), np.int64),
            )
            (out / f"rank{launch.rank}.json").write_text(json.dumps({"names": names, "skipped": emb.skipped}))
        from locatdino.evaluation.lincls.features import LinearInput
        from locatdino.evaluation.lincls.protocol import LinclsConfig, encode

        loaded.clear()
        model = tiny_encoder()
        cfg = LinclsConfig(input_size=32, eval_batch_size=2, num_workers=0, progress=False)
        store, skipped = encode(model, LinearInput.reference(model), images, cfg, model_device(model), "", shared=True)
        np.savez(
            out / f"lincls{launch.rank}.npz",
            features=store.features,
            labels=store.labels,
            filled=store.filled,
            skipped=np.array(skipped, np.int64),
            loaded=np.array(sorted(loaded), np.int64),
        )
        store.close()
        if ranks.is_writer():
            (out / f"written-by-{launch.rank}").write_text("results")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
