"""What training changes in the patch tokens: their norm, the share of one direction, how alike a
scene's tokens are.

For each backbone (``--model [LABEL=]NAME[:CHECKPOINT]`` as ``locatdino compare`` takes them,
``none``: random init with ``--seed``) and for each patch's pixels (``pixels``, on the first backbone's grid), on
the demo's held-out query scenes (50 at 128 px, fp32), the features Hummingbird and the linear
probe read (last block, no final norm, no PRR):

- ``norm``: the mean L2 norm of a token (the linear probe sees it; Hummingbird does not);
- ``top_share``: the share of the tokens' variance (all tokens of all scenes, centred) along the
  first principal direction — near 1 when one direction carries everything;
- ``within_scene`` / ``across_scenes``: the mean cosine similarity of two different tokens of
  one scene, and of two tokens of different scenes. Label transfer needs tokens of one scene to
  differ where the classes differ: ``within_scene`` near ``across_scenes`` near 1 leaves the
  k-NN little to go on.

    python -m benchmarks.studies.token_stats \\
        --model vit-random=vit_tiny_patch16_224:runs/demo/vit_random_init.pth \\
        --model vit-dino=vit_tiny_patch16_224:runs/demo/vit_teacher.pth
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.evaluation.compare.measure import ShownImages
from locatdino.evaluation.features import FeatureExtractor, load_backbone
from locatdino.evaluation.splits import open_split
from locatdino.models.baselines import PixelPatches
from locatdino.models.model_spec import MODEL_METAVAR, parse_model
from locatdino.models.token_grid import patch_size


def token_stats(extractor: FeatureExtractor, images: torch.Tensor) -> dict[str, float]:
    """The statistics of the module docstring for the raw tokens of ``images`` (uint8)."""
    tokens = torch.cat([extractor(images[i : i + 16]) for i in range(0, len(images), 16)]).flatten(1, 2).double()
    scenes, per_scene, _ = tokens.shape
    flat = tokens.flatten(0, 1)
    variances = torch.linalg.svdvals(flat - flat.mean(0)) ** 2
    unit = torch.nn.functional.normalize(tokens, dim=-1)
    means = unit.mean(1)
    gram = means @ means.T  # [scenes, scenes]: the mean cosine of a token of one and a token of the other
    own = gram.diagonal()
    within = (own * per_scene**2 - per_scene) / (per_scene * (per_scene - 1))  # self-pairs left out
    across = (gram.sum() - own.sum()) / (scenes * (scenes - 1))
    return {
        "norm": flat.norm(dim=-1).mean().item(),
        "top_share": (variances[0] / variances.sum()).item(),
        "within_scene": within.mean().item(),
        "across_scenes": across.item(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar=MODEL_METAVAR)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--input-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="random init of a model without a checkpoint")
    add_results_option(p, "token_stats.json")
    args = p.parse_args()
    args.results = results_file(args, "token_stats.json")  # before any measuring
    torch.set_num_threads(2)
    val = open_split("scenes", None, "val", args.num_val, 0, args.input_size)
    images = ShownImages.from_split(val, len(val), args.input_size).images
    rows, patch = {}, None
    for label, name, checkpoint in map(parse_model, args.model):
        torch.manual_seed(args.seed)
        backbone = load_backbone(name, checkpoint)
        patch = patch or patch_size(backbone)[0]
        rows[label or name] = token_stats(FeatureExtractor(backbone, l2_normalize=False), images)
    rows["pixels"] = token_stats(FeatureExtractor(PixelPatches(patch), l2_normalize=False), images)
    first = next(iter(rows.values()))["norm"]
    print(
        "| tokens | mean norm (× first) | top direction's share of variance | cosine within a scene | "
        "cosine across scenes |\n|---|---|---|---|---|"
    )
    for name, r in rows.items():
        print(
            f"| {name} | {r['norm']:.2f} ({r['norm'] / first:.1f}×) | {100 * r['top_share']:.0f} % | "
            f"{r['within_scene']:.3f} | {r['across_scenes']:.3f} |"
        )
    write_results(
        args.results, "token_stats.json", {"num_val": args.num_val, "input_size": args.input_size, "rows": rows}
    )


if __name__ == "__main__":
    main()
