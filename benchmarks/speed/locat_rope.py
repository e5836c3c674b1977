"""LocAt on the other backbones against their vanilla versions, same inputs, in one run: a RoPE ViT
(DINOv3 ViT-S/16's architecture) and Swin-T.

    python -m benchmarks.speed.locat_rope [--reps 5] [--pairs rope swin]

- RoPE pair: timm ``vit_small_patch16_dinov3`` (4 registers, LayerScale, DINOv3's RoPE), class-token
  pool, against ``locatvit_small_patch16_dinov3`` (the same with GAug in every block's RoPE attention
  and PRR). Cases as ``benchmarks.speed.locatvit`` (whose train step, batch and evaluation this
  reuses): a DINO training step (forward + backward + AdamW on 8 × 224 px and 32 × 96 px crops) and
  an evaluation forward of 4 images at 448 px.
- Swin pair: timm ``swin_tiny_patch4_window7_224`` against ``locatswin_tiny`` (GAug in every window
  attention, PRR on the last stage's map), built as ``create_backbone`` builds them (no head,
  ``dynamic_img_size``). Cases: a supervised training step (the recipe that trains Swin here: DINO and
  iBOT refuse it; forward + backward + AdamW on 8 × 224 px) and the same 448 px evaluation forward.
- Both models of a pair share the init seed; the models alternate rep by rep, process CPU time at 1
  thread; ratios over the vanilla model: of the minima, and the median of the per-rep ratios.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import timm
import torch

import locatdino.models  # noqa: F401  (registers locatvit_*_patch16_dinov3, locatswin_*)
from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.speed.locatvit import CLOCKS, dino_batch, evaluate, train_step

EVAL = "eval 448 px (4 images)"
# pair: ({label: timm name}, {case: target ratio}); the vanilla model first
PAIRS = {
    "rope": (
        {"RoPE ViT-S": "vit_small_patch16_dinov3", "LocAt-RoPE ViT-S": "locatvit_small_patch16_dinov3"},
        {"train step": 1.10, EVAL: 1.20},
    ),
    "swin": (
        {"Swin-T": "swin_tiny_patch4_window7_224", "LocAtSwin-T": "locatswin_tiny"},
        {"train step (8 × 224 px)": 1.10, EVAL: 1.20},
    ),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name.startswith("vit_small"):
        return timm.create_model(name, num_classes=0, global_pool="token")
    return timm.create_model(name, num_classes=0, dynamic_img_size=True)


def cases(pair: str) -> dict[str, Callable[[torch.nn.Module, torch.optim.Optimizer], None]]:
    g = torch.Generator().manual_seed(1)
    x448 = torch.randn(4, 3, 448, 448, generator=g)
    if pair == "rope":
        crops = dino_batch()
        train = "train step"
    else:
        crops = (torch.randn(8, 3, 224, 224, generator=g),)
        train = "train step (8 × 224 px)"
    return {train: lambda m, o: train_step(m.train(), o, crops), EVAL: lambda m, o: evaluate(m, x448)}


def bench(pair: str, reps: int, clock) -> dict[str, dict[str, list[float]]]:
    names, _ = PAIRS[pair]
    models = {label: build(name) for label, name in names.items()}
    opts = {label: torch.optim.AdamW(m.parameters(), lr=1e-4) for label, m in models.items()}
    runs: dict[str, dict[str, list[float]]] = {}
    for case, fn in cases(pair).items():
        for label in names:  # warm-up
            fn(models[label], opts[label])
        runs[case] = {label: [] for label in names}
        for _ in range(reps):
            for label in names:
                start = clock()
                fn(models[label], opts[label])
                runs[case][label].append(clock() - start)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per model and case")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time or wall clock")
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS), help="backbone pairs to run")
    add_results_option(parser, "locat_rope.json")
    args = parser.parse_args()
    args.results = results_file(args, "locat_rope.json")  # before any measuring
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} time, min of {args.reps}")
    rows = []
    for pair in args.pairs:
        (base, locat), targets = PAIRS[pair][0], PAIRS[pair][1]
        for case, by_label in bench(pair, args.reps, CLOCKS[args.clock]).items():
            t_base, t_locat = min(by_label[base]), min(by_label[locat])
            paired = statistics.median(a / b for a, b in zip(by_label[locat], by_label[base]))
            rows.append(
                {
                    "pair": pair,
                    "case": case,
                    "seconds": {base: t_base, locat: t_locat},
                    "ratio_of_minima": t_locat / t_base,
                    "median_paired_ratio": paired,
                    "target": targets[case],
                }
            )
            print(
                f"{case:24s} {base} {t_base * 1e3:8.1f} ms  {locat} {t_locat * 1e3:8.1f} ms  "
                f"ratio {t_locat / t_base:.3f} (paired {paired:.3f}, target ≤ {targets[case]:.2f})"
            )
    write_results(args.results, "locat_rope.json", {"rows": rows})


if __name__ == "__main__":
    main()
