"""Model FLOPs utilisation (MFU) of the DINO step, and what torch's switches add to it.

MFU = model FLOPs per step / step time / the device's peak. Model FLOPs = the teacher's forward
+ 3 × the student's forward (the backward costs twice the forward: the usual convention, which
leaves out what an implementation recomputes, such as flash attention's scores), each forward
counted by torch (``torch.utils.flop_counter.FlopCounterMode``: every matmul, convolution and
attention; elementwise work and the optimizer are not model FLOPs) in eager mode, once per model
and batch: the same count for every switch, since a faster implementation does not change the
model. Step: teacher forward (no grad) on the 2 global
crops, student forward on all crops, DINO loss, backward, per-tensor clipping, AdamW, EMA teacher,
centre (what ``DINOModule`` does per step, without Lightning), on an in-memory batch.

Rows climb a ladder, each adding one change to the row above, and report the gain over it:

- ``eager``: bf16 autocast, AdamW (foreach), no compilation: what ``locatdino fit`` runs today;
- ``+ fused AdamW``: ``torch.optim.AdamW(fused=True)``, one kernel for the whole update;
- ``+ compile``: ``torch.compile`` of teacher forward + student forward + loss (the backward is
  compiled with it by AOTAutograd);
- ``+ bf16 weights``: student and teacher held in bf16 (Lightning's ``bf16-true``): faster, but
  the teacher EMA (``0.996 · t + 0.004 · s``) is then rounded away at bf16's 8-bit mantissa, so it
  is measured, not recommended.

Each at every ``--batch`` (per GPU). Default sizes: the reference recipe (2 × 224 + 8 × 96 px,
65 536 prototypes), ViT-S/16 and LocAtViT-S/16; ``--toy`` shrinks everything for a CPU run whose
timings mean nothing (tests/benchmarks/test_bench_mfu.py checks the FLOP count against a hand count).

    python -m benchmarks.speed.mfu --device cuda --peak-tflops 790                        # H200, bf16 dense
    python -m benchmarks.speed.mfu --toy --device cpu --batch 4 8 --results /tmp/mfu.json  # CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.ssl import DINOModule, clip_grad_per_tensor_, update_teacher

aten = torch.ops.aten
MODELS = {"ViT-S": "vit_small_patch16_224", "LocAtViT-S": "locatvit_small_patch16_224"}
LADDER = ("eager", "+ fused AdamW", "+ compile", "+ bf16 weights")
FULL = dict(backbone_kwargs={}, head=dict(out_dim=65536), crops=(224, 96, 8))
TOY = dict(
    backbone_kwargs=dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
    head=dict(out_dim=256, hidden_dim=128, bottleneck_dim=64),
    crops=(32, 16, 2),
)


def _cpu_sdpa(query, key, value, *args, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, **kwargs) -> int:
    return 2 * sdpa_flop_count(query.shape, key.shape, value.shape)  # dQ, dK, dV, dP: no recomputation


def _attention_ops() -> dict:
    """Fused attention ops torch's counter does not know: the CPU's, and GAug's separable-bias
    attention (``locatdino.models.gaug``: the same q·kᵀ and attention·v, plus a bias)."""
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    }
    gaug = getattr(torch.ops, "locatdino", None)
    for name, formula in (
        ("separable_bias_attention", _cpu_sdpa),
        ("separable_bias_attention_backward", _cpu_sdpa_backward),
    ):
        if gaug is not None and hasattr(gaug, name):
            mapping[getattr(gaug, name)] = formula
    return mapping


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of everything ``fn`` runs, as ``FlopCounterMode`` counts them, plus fused attention
    torch does not count (``_attention_ops``), so a forward's count does not depend on the device."""
    mapping = _attention_ops()
    with FlopCounterMode(display=False, custom_mapping={k: _raw(v) for k, v in mapping.items()}) as counter:
        fn()
    return counter.get_total_flops()


def _raw(formula: Callable[..., int]) -> Callable[..., int]:
    """A formula on the op's real arguments (``FlopCounterMode`` passes shapes unless told)."""
    formula._get_raw = True  # what register_flop_formula(get_raw=True) marks
    return formula


class DinoStep:
    """One DINO training step of ``module`` on a fixed random batch of ``crops`` ``(G, L, V_l)``
    px, with the ladder's switches; ``autocast``: bf16 autocast (off: the weights' dtype)."""

    def __init__(
        self,
        module: DINOModule,
        batch: int,
        crops: tuple[int, int, int],
        device: torch.device,
        fused: bool = False,
        compiled: bool = False,
        bf16_weights: bool = False,
        autocast: bool = True,
    ) -> None:
        self.module = m = module
        dtype = torch.bfloat16 if bf16_weights else torch.float32
        m.to(device, dtype)
        self.device, self.autocast = device, autocast and not bf16_weights
        self.params = [p for p in m.student.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, fused=True if fused else None)
        g, loc, n_local = crops
        self.crops = (
            torch.randn(2, batch, 3, g, g, device=device, dtype=dtype),
            torch.randn(n_local, batch, 3, loc, loc, device=device, dtype=dtype),
        )
        self.forward_loss = torch.compile(self._forward_loss) if compiled else self._forward_loss

    @classmethod
    def of(cls, model: str, batch: int, sizes: dict, device: torch.device, **switches) -> DinoStep:
        """The step of a freshly built (seed 0) ``MODELS`` backbone at ``sizes`` (``FULL``, ``TOY``)."""
        torch.manual_seed(0)
        module = DINOModule(model, dict(sizes["backbone_kwargs"]), batch_size=batch, **sizes["head"])
        return cls(module, batch, sizes["crops"], device, **switches)

    def _forward_loss(self, crops_global: torch.Tensor, crops_local: torch.Tensor):
        m = self.module
        with torch.no_grad():
            teacher_out = m.forward_branch(m.teacher, [crops_global])
            probs = m.dino_loss.teacher_targets(teacher_out, 0.04)
        return m.dino_loss(m.forward_branch(m.student, [crops_global, crops_local]), probs), teacher_out

    def model_flops(self) -> int:
        """Teacher forward + 3 × student forward (see the module docstring)."""
        m, (crops_global, crops_local) = self.module, self.crops
        with torch.no_grad():
            teacher = count_flops(lambda: m.forward_branch(m.teacher, [crops_global]))
            student = count_flops(lambda: m.forward_branch(m.student, [crops_global, crops_local]))
        return teacher + 3 * student

    def __call__(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss, teacher_out = self.forward_loss(*self.crops)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_per_tensor_(self.params, 3.0)
        self.opt.step()
        update_teacher(self.module.student.parameters(), self.module.teacher.parameters(), 0.996)
        self.module.dino_loss.update_center(teacher_out)


def median_step_s(step: Callable[[], None], device: torch.device, warmup: int, reps: int) -> tuple[float, float]:
    """(first call in s, compilation included; median of ``reps`` calls after ``warmup``)."""

    def once() -> float:
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    first = once()
    for _ in range(warmup):
        once()
    return first, statistics.median(once() for _ in range(reps))


@dataclass
class Row:
    model: str
    batch: int
    config: str
    step_ms: float
    images_per_s: float
    gflop_per_step: float
    achieved_tflops: float
    mfu: float
    gain: float  # step time of the row above / this one (1.0 for the first)
    first_call_s: float


def ladder(
    model: str,
    batch: int,
    sizes: dict,
    device: torch.device,
    peak_tflops: float,
    warmup: int,
    reps: int,
    configs: tuple[str, ...] = LADDER,
) -> list[Row]:
    flops = DinoStep.of(MODELS[model], batch, sizes, device).model_flops()
    rows: list[Row] = []
    for _i, name in enumerate(configs):
        switches = dict(
            fused=LADDER.index(name) >= 1, compiled=LADDER.index(name) >= 2, bf16_weights=LADDER.index(name) >= 3
        )
        try:
            first, median = median_step_s(
                DinoStep.of(MODELS[model], batch, sizes, device, **switches), device, warmup, reps
            )
        except Exception as exc:  # noqa: BLE001  (out of memory, a compile error: report the row, go on)
            print(f"{model} batch {batch} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        achieved = flops / median / 1e12
        gain = rows[-1].step_ms / (median * 1e3) if rows else 1.0
        rows.append(
            Row(
                model,
                batch,
                name,
                median * 1e3,
                batch / median,
                flops / 1e9,
                achieved,
                achieved / peak_tflops,
                gain,
                first,
            )
        )
        r = rows[-1]
        print(
            f"{model:<11} {batch:>5} {name:<15} {r.step_ms:9.1f} {r.images_per_s:9.1f} {r.gflop_per_step:8.1f} "
            f"{r.achieved_tflops:9.2f} {100 * r.mfu:6.2f} {r.gain:6.2f}x {first:7.1f}",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batch", type=int, nargs="*", default=[64, 256], help="images per GPU")
    ap.add_argument("--configs", nargs="*", default=list(LADDER), choices=list(LADDER))
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="the device's dense bf16 peak (H200: ~790)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--toy", action="store_true", help="tiny models and crops (a CPU smoke run)")
    add_results_option(ap, "mfu.json")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (more spin against other jobs)")
    args = ap.parse_args()
    args.results = results_file(args, "mfu.json")  # before any measuring
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = TOY if args.toy else FULL
    print(
        f"torch {torch.__version__}, {device}"
        f"{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}, peak {args.peak_tflops} "
        f"TFLOP/s, crops 2 x {sizes['crops'][0]} + {sizes['crops'][2]} x {sizes['crops'][1]} px"
    )
    print(
        f"{'model':<11} {'batch':>5} {'config':<15} {'step ms':>9} {'img/s':>9} {'GFLOP':>8} {'TFLOP/s':>9} "
        f"{'MFU %':>6} {'gain':>7} {'first s':>7}"
    )
    rows: list[Row] = []
    for model in args.models:
        for batch in args.batch:
            rows += ladder(model, batch, sizes, device, args.peak_tflops, args.warmup, args.reps, tuple(args.configs))
            # after every ladder: a run cut short keeps what it measured
            write_results(
                args.results, "mfu.json", {"peak_tflops": args.peak_tflops, "rows": [asdict(r) for r in rows]}
            )


if __name__ == "__main__":
    main()
