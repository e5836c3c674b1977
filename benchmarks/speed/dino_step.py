"""DINO training step: ``DINOModule`` under a Lightning ``Trainer`` vs a bare PyTorch loop.

Both run the same step on the same in-memory batch in the same process (same threads): teacher
forward, student forward, DINO loss, non-finite check, backward, last-layer freeze, per-tensor
clipping, AdamW with the scheduled lr / weight decay, EMA teacher, centre update and the logged
teacher entropies (every 10 steps). Lightning adds its loop, hooks, logging (CSV, every 10 steps)
and the ``self.log`` calls. Rounds alternate (Lightning, bare, Lightning, ...) so load from other jobs
hits both alike; a step's time is the interval between consecutive step starts, the first step
of each round (warm-up, Trainer set-up) excluded. Target: ratio of medians <= 1.05.

    python -m benchmarks.speed.dino_step
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.ssl import DINOModule, clip_grad_per_tensor_, teacher_entropies, update_teacher

CONFIGS = {
    # name: (backbone kwargs, head dims, batch, global px, local px, local crops)
    "vit_tiny_64px": (dict(img_size=64), dict(out_dim=4096, hidden_dim=2048, bottleneck_dim=256), 16, 64, 32, 4),
    "overhead_bound": (
        dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
        dict(out_dim=256, hidden_dim=128, bottleneck_dim=64),
        8,
        32,
        16,
        2,
    ),
}


LOG_EVERY = 10


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, *args) -> None:
        self.starts.append(time.perf_counter())


def lightning_round(module: DINOModule, batch: dict, steps: int, log_dir: str) -> list[float]:
    timer = StepTimer()
    trainer = pl.Trainer(
        max_steps=steps,
        logger=CSVLogger(log_dir),
        log_every_n_steps=LOG_EVERY,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(module, torch.utils.data.DataLoader([batch] * steps, batch_size=None))
    return [b - a for a, b in zip(timer.starts[1:-1], timer.starts[2:])]


def bare_round(module: DINOModule, batch: dict, steps: int) -> list[float]:
    """The same DINO step written as a plain loop (schedules from the module's arrays)."""
    student, teacher, loss_fn, h = module.student, module.teacher, module.dino_loss, module.hparams
    named = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim > 1 and not n.endswith(".bias")]
    opt = torch.optim.AdamW(
        [
            {"params": decay},
            {"params": [p for n, p in named if p.ndim <= 1 or n.endswith(".bias")], "weight_decay": 0.0},
        ]
    )
    last_layer = [p for n, p in named if n.startswith("head.last_layer.")]
    params = [p for _, p in named]
    sched = module.schedules
    starts = []
    for step in range(steps):
        starts.append(time.perf_counter())
        v = sched.at(step)
        with torch.no_grad():
            t_out = module.forward_branch(teacher, [batch["global"]])
            probs = loss_fn.teacher_targets(t_out, v["teacher_temp"])
        loss = loss_fn(module.forward_branch(student, [batch["global"], batch["local"]]), probs)
        if not torch.isfinite(loss):
            raise FloatingPointError("non-finite loss")
        loss_fn.update_center(t_out)
        if (step + 1) % LOG_EVERY == 0:  # what DINOModule logs on the logger's steps
            teacher_entropies(probs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step < h.freeze_last_layer * module._steps_per_epoch:
            for p in last_layer:
                p.grad = None
        clip_grad_per_tensor_(params, h.clip_grad)
        for group in opt.param_groups:
            group["lr"] = v["lr"]
        opt.param_groups[0]["weight_decay"] = v["weight_decay"]
        opt.step()
        update_teacher(student.parameters(), teacher.parameters(), v["teacher_momentum"])
    starts.append(time.perf_counter())
    return [b - a for a, b in zip(starts[1:-1], starts[2:])]


def run(name: str, rounds: int, steps: int) -> tuple[float, float, float]:
    backbone_kwargs, head, batch_size, size, local_size, n_local = CONFIGS[name]
    torch.manual_seed(0)
    module = DINOModule("vit_tiny_patch16_224", backbone_kwargs, batch_size=batch_size, **head)
    batch = {
        "global": torch.randn(2, batch_size, 3, size, size),
        "local": torch.randn(n_local, batch_size, 3, local_size, local_size),
    }
    light, bare = [], []
    with tempfile.TemporaryDirectory() as log_dir:
        for _ in range(rounds):
            light += lightning_round(module, batch, steps, log_dir)  # also builds module.schedules
            bare += bare_round(module, batch, steps)
    ml, mb = statistics.median(light), statistics.median(bare)
    return ml, mb, ml / mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12, help="steps per round (first one not timed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    add_results_option(parser, "dino_step.json")
    args = parser.parse_args()
    args.results = results_file(args, "dino_step.json")  # before any measuring
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, lightning {pl.__version__}, {args.threads} thread(s), "
        f"{args.rounds} rounds x {args.steps - 2} timed steps per side"
    )
    print(f"{'config':<16} {'lightning ms':>13} {'bare ms':>9} {'ratio':>7}")
    rows = {}
    for name in args.configs:
        ml, mb, ratio = run(name, args.rounds, args.steps)
        print(f"{name:<16} {ml * 1e3:13.1f} {mb * 1e3:9.1f} {ratio:7.3f}")
        rows[name] = {"lightning_s": ml, "bare_s": mb, "ratio": ratio}
        write_results(args.results, "dino_step.json", {"median_step": rows})


if __name__ == "__main__":
    main()
