"""LocAt on a RoPE ViT against the RoPE ViT (DINOv3 ViT-S/16's architecture), same inputs, in one run.

    python -m benchmarks.speed.locat_rope [--reps 5]

- Models: RoPE ViT-S = timm ``vit_small_patch16_dinov3`` (4 registers, LayerScale, DINOv3's RoPE),
  class-token pool; LocAt-RoPE ViT-S = ``locatvit_small_patch16_dinov3`` (the same with GAug in
  every block's RoPE attention and PRR), both ``num_classes=0``, same init seed.
- Cases and clock as ``benchmarks.speed.locatvit`` (whose train step, batch and evaluation this
  reuses): a DINO training step (forward + backward + AdamW on 8 × 224 px and 32 × 96 px crops) and
  an evaluation forward of 4 images at 448 px, the models alternated rep by rep, process CPU time
  at 1 thread; ratios over the RoPE ViT: of the minima, and the median of the per-rep ratios.
"""

from __future__ import annotations

import argparse
import statistics

import timm
import torch

import locatdino.models  # noqa: F401  (registers locatvit_*_patch16_dinov3)
from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.speed.locatvit import CLOCKS, dino_batch, evaluate, train_step

MODELS = {"RoPE ViT-S": "vit_small_patch16_dinov3", "LocAt-RoPE ViT-S": "locatvit_small_patch16_dinov3"}
TARGETS = {"train step": 1.10, "eval 448 px (4 images)": 1.20}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=0, global_pool="token" if name.startswith("vit") else "prr")


def bench(reps: int, clock) -> dict[str, dict[str, list[float]]]:
    models = {label: build(name) for label, name in MODELS.items()}
    opts = {label: torch.optim.AdamW(m.parameters(), lr=1e-4) for label, m in models.items()}
    crops, x448 = dino_batch(), torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(1))
    cases = {
        "train step": lambda m, o: train_step(m.train(), o, crops),
        "eval 448 px (4 images)": lambda m, o: evaluate(m, x448),
    }
    runs: dict[str, dict[str, list[float]]] = {}
    for case, fn in cases.items():
        for label in MODELS:  # warm-up
            fn(models[label], opts[label])
        runs[case] = {label: [] for label in MODELS}
        for _ in range(reps):
            for label in MODELS:
                start = clock()
                fn(models[label], opts[label])
                runs[case][label].append(clock() - start)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per model and case")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time or wall clock")
    add_results_option(parser, "locat_rope.json")
    args = parser.parse_args()
    args.results = results_file(args, "locat_rope.json")  # before any measuring
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} time, min of {args.reps}")
    base, locat = MODELS
    rows = []
    for case, by_label in bench(args.reps, CLOCKS[args.clock]).items():
        t_base, t_locat = min(by_label[base]), min(by_label[locat])
        paired = statistics.median(a / b for a, b in zip(by_label[locat], by_label[base]))
        rows.append(
            {
                "case": case,
                "seconds": {base: t_base, locat: t_locat},
                "ratio_of_minima": t_locat / t_base,
                "median_paired_ratio": paired,
                "target": TARGETS[case],
            }
        )
        print(
            f"{case:24s} {base} {t_base * 1e3:8.1f} ms  {locat} {t_locat * 1e3:8.1f} ms  "
            f"ratio {t_locat / t_base:.3f} (paired {paired:.3f}, target ≤ {TARGETS[case]:.2f})"
        )
    write_results(args.results, "locat_rope.json", {"rows": rows})


if __name__ == "__main__":
    main()
