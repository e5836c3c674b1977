"""Does pretraining help on the built-in scenes? One table: the floors, random init, each objective.

Collects what the other benchmarks measured on the same held-out scenes (100 memory / 50 query at
128 px, fp32, exact search; Hummingbird and the cached linear probe of ``locatdino compare``):

- the network-free rows and the demo's networks from a ``locatdino compare --baselines`` report
  folder (``--report``: the demo's ``compare/``), each with its paired interval to ``pixels`` and
  to the random init of its backbone (over the query scenes);
- supervised runs (``--supervised LABEL=DIR``: ``supervised.py`` output folders, one per
  learning rate): per variant the mean ± std over seeds and the seed-mean Δ to random init with
  its interval (docs/evaluation.md); the former recipe's lr (64× DeiT's rule), from RESULTS.md;
- DINO and iBOT at 80 steps, 3 seeds: the numbers of ``ibot.py`` in RESULTS.md (its runs
  are not kept), copied below; recipe variants run since (``--ssl-variants LABEL=DIR``:
  ``ibot.py`` output folders) with their seed-mean Δ to random init;
- token statistics (``--token-stats``: the results file of ``token_stats.py``).

Writes one JSON (``--results``) and prints the table's markdown::

    python -m benchmarks.studies.floor_results --report runs/demo/compare \\
        --supervised "5e-4=runs/sup_lr0.0005" --token-stats benchmarks/results/token_stats.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.studies.supervised import _confusions, seed_mean_miou_interval
from locatdino.evaluation.compare.intervals import model_differences

# ibot.py --steps 80, seeds 0 1 2 (benchmarks/RESULTS.md, "Does pretraining help on the built-in scenes?"):
# mean ± std over seeds, and the seed-mean Δ to random init [95 %] over the query scenes
SSL_80_STEPS = {
    ("vit", "random"): {"hbird": [21.4, 0.5], "linprobe": [25.3, 0.3]},
    ("vit", "dino"): {
        "hbird": [20.3, 0.6],
        "linprobe": [25.0, 0.6],
        "hbird_delta": [-1.1, -1.9, -0.1],
        "linprobe_delta": [-0.2, -0.8, 0.4],
    },
    ("vit", "ibot"): {
        "hbird": [19.6, 0.6],
        "linprobe": [24.6, 0.2],
        "hbird_delta": [-1.8, -2.9, -0.6],
        "linprobe_delta": [-0.6, -1.2, -0.0],
    },
    ("locatvit", "random"): {"hbird": [21.5, 0.2], "linprobe": [25.1, 0.4]},
    ("locatvit", "dino"): {
        "hbird": [20.8, 0.4],
        "linprobe": [24.9, 0.5],
        "hbird_delta": [-0.7, -1.6, 0.2],
        "linprobe_delta": [-0.2, -0.7, 0.3],
    },
    ("locatvit", "ibot"): {
        "hbird": [20.2, 0.3],
        "linprobe": [24.3, 0.3],
        "hbird_delta": [-1.3, -2.2, -0.3],
        "linprobe_delta": [-0.8, -1.3, -0.3],
    },
}
# the tiny supervised recipe at its former lr, 3.2e-2 per 512 images (64x DeiT's rule), ViT, seeds 0-4:
# supervised.py --steps 96 (benchmarks/RESULTS.md, "Does pretraining help on the built-in scenes?"; runs not kept)
SUPERVISED_64X = {
    "seeds": [0, 1, 2, 3, 4],
    "hbird": [13.0, 1.6],
    "hbird_delta": [-8.3, -10.4, -5.9],
    "linprobe": [12.4, 1.6],
    "linprobe_delta": [-12.8, -15.4, -10.1],
    "top1": [32.5, 1.3],
}
OBJECTIVE_NAMES = {"dino": "DINO", "ibot": "iBOT"}


def _interval(record) -> list[float]:
    return [round(record.delta, 2), round(record.low, 2), round(record.high, 2)]


def compare_rows(folder: Path) -> dict[str, dict]:
    """Every row of a ``compare --baselines`` report: mIoU of both protocols, Δ to ``pixels`` and
    to ``<backbone>-random`` of the same backbone (the baselines: to the first random init)."""
    models = {m["spec"]["name"]: m for m in json.loads((folder / "results.json").read_text())["models"]}
    randoms = [n for n in models if n.endswith("-random")]
    rows = {}
    for name, m in models.items():
        row = {"hbird": round(m["hbird"]["miou"], 2), "linprobe": round(m["linprobe"]["miou"], 2)}
        random = f"{name.split('-')[0]}-random" if f"{name.split('-')[0]}-random" in models else randoms[0]
        for other in ("pixels", random):
            if other != name:
                differences = model_differences(m, models[other], folder)
                row[f"vs_{other}"] = {k: _interval(differences[k]) for k in ("miou", "linprobe")}
        rows[name] = row
    return rows


def supervised_rows(folder: Path, steps: int) -> dict[str, dict]:
    """Per variant of a ``supervised.py`` folder: mean ± std over seeds, seed-mean Δ to random init."""
    runs = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    by = {(r["variant"], r["seed"]): r for r in runs if r["steps"] == steps and r["labels"] == "cls"}
    rows = {}
    for variant in dict.fromkeys(v for v, _ in by):
        rs = [by[k] for k in sorted(by) if k[0] == variant]
        row = {"seeds": [r["seed"] for r in rs], "lr_flags": rs[0].get("extra", [])}
        for key in ("hbird", "hbird_random", "linprobe", "linprobe_random", "top1"):
            values = [r[key] for r in rs]
            row[key] = [
                round(statistics.mean(values), 2),
                round(statistics.stdev(values), 2) if len(values) > 1 else None,
            ]
        for protocol in ("hbird", "linprobe"):
            trained = [_confusions(r, protocol, "trained") for r in rs]
            random = [_confusions(r, protocol, "random") for r in rs]
            row[f"{protocol}_delta"] = _interval(seed_mean_miou_interval(trained, random))
        rows[variant] = row
    return rows


def ssl_rows(folder: Path, steps: int) -> dict[str, dict]:
    """Per (backbone, objective) of a ``ibot.py`` folder: mean ± std over seeds and the seed-mean
    Δ to the random init of the same seeds (scored in the same folder)."""
    runs = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    random = {(r["backbone"], r["seed"]): r for r in runs if r["objective"] == "random"}
    rows = {}
    for backbone, objective in dict.fromkeys((r["backbone"], r["objective"]) for r in runs if r["steps"] == steps):
        rs = sorted(
            (r for r in runs if (r["backbone"], r["objective"], r["steps"]) == (backbone, objective, steps)),
            key=lambda r: r["seed"],
        )
        row = {"seeds": [r["seed"] for r in rs], "extra": rs[0].get("extra", [])}
        for protocol in ("hbird", "linprobe"):
            values = [r[protocol] for r in rs]
            row[protocol] = [
                round(statistics.mean(values), 2),
                round(statistics.stdev(values), 2) if len(values) > 1 else None,
            ]
            trained = [_confusions(r, protocol, "trained") for r in rs]
            base = [_confusions(random[(backbone, r["seed"])], protocol, "random") for r in rs]
            row[f"{protocol}_delta"] = _interval(seed_mean_miou_interval(trained, base))
        rows[f"{backbone}/{objective}"] = row
    return rows


def _cell(pair: list) -> str:
    return f"{pair[0]:.1f}" if pair[1] is None else f"{pair[0]:.1f} ± {pair[1]:.1f}"


def _delta(d: list | None) -> str:
    return "—" if d is None else f"{d[0]:+.1f} [{d[1]:+.1f}, {d[2]:+.1f}]"


def markdown(result: dict, chosen: str) -> str:
    """RESULTS' two tables: one row per feature (the supervised rows at lr ``chosen``), both
    protocols, Δ to random init; then the supervised lr sweep (ViT)."""
    lines = [
        "| features | Hummingbird | Δ to random init [95 %] | linear probe | Δ to random init [95 %] | seeds |",
        "|---|---|---|---|---|---|",
    ]
    demo = result["compare"]
    for name in ("position-prior", "pixels"):
        row = demo[name]
        random = next(k for k in row if k.startswith("vs_") and k != "vs_pixels")
        lines.append(
            f"| {name} | {row['hbird']:.1f} | {_delta(row[random]['miou'])} | {row['linprobe']:.1f} | "
            f"{_delta(row[random]['linprobe'])} | none needed |"
        )
    for backbone in ("vit", "locatvit"):
        for objective in ("random", "dino", "ibot"):
            r = result["ssl_80_steps"][f"{backbone}/{objective}"]
            what = "random init" if objective == "random" else f"{OBJECTIVE_NAMES[objective]}, 80 steps"
            lines.append(
                f"| {backbone}, {what} | {_cell(r['hbird'])} | {_delta(r.get('hbird_delta'))} | "
                f"{_cell(r['linprobe'])} | {_delta(r.get('linprobe_delta'))} | 3 |"
            )
        for label, rows in result["ssl_variants"].items():
            for key, r in rows.items():
                if key.startswith(f"{backbone}/"):
                    lines.append(
                        f"| {backbone}, {OBJECTIVE_NAMES[key.split('/')[1]]}, 80 steps, {label} | "
                        f"{_cell(r['hbird'])} | {_delta(r['hbird_delta'])} | {_cell(r['linprobe'])} | "
                        f"{_delta(r['linprobe_delta'])} | "
                        f"{len(r['seeds'])} |"
                    )
        r = result["supervised"].get(chosen, {}).get(backbone)
        if r:
            lines.append(
                f"| {backbone}, supervised, 96 steps, lr {chosen} | {_cell(r['hbird'])} | {_delta(r['hbird_delta'])} | "
                f"{_cell(r['linprobe'])} | {_delta(r['linprobe_delta'])} | {len(r['seeds'])} |"
            )
    lines += [
        "",
        "| lr per 512 images (ViT, 96 steps) | Hummingbird | Δ to random init [95 %] | linear probe | "
        "Δ to random init [95 %] | held-out top-1 | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, rows in result["supervised"].items():
        if "vit" in rows:
            r = rows["vit"]
            lines.append(
                f"| {label} | {_cell(r['hbird'])} | {_delta(r['hbird_delta'])} | {_cell(r['linprobe'])} | "
                f"{_delta(r['linprobe_delta'])} | {_cell(r['top1'])} | {len(r['seeds'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", type=Path, required=True, help="a compare --baselines report folder")
    p.add_argument("--supervised", nargs="*", default=[], metavar="LABEL=DIR", help="supervised.py folders")
    p.add_argument("--steps", type=int, default=96, help="the supervised runs' steps")
    p.add_argument("--chosen", default=None, help="the --supervised LABEL of the main table (default: the first)")
    p.add_argument(
        "--ssl-variants", nargs="*", default=[], metavar="LABEL=DIR", help="ibot.py folders of recipe variants"
    )
    p.add_argument("--token-stats", type=Path, default=None)
    add_results_option(p, "pretraining_floor.json")
    args = p.parse_args()
    args.results = results_file(args, "pretraining_floor.json")  # before any measuring
    result = {
        "protocol": "100 memory / 50 query held-out scenes at 128 px, fp32, exact search; Hummingbird k 30; "
        "linear probe 320 x 8 cached; mIoU in %; Δ [95 %]: seed-mean paired bootstrap over the scenes",
        "compare": compare_rows(args.report),
        "ssl_80_steps": {f"{b}/{o}": v for (b, o), v in SSL_80_STEPS.items()},
        "supervised": {
            **{
                label: supervised_rows(Path(folder), args.steps)
                for label, folder in (s.split("=", 1) for s in args.supervised)
            },
            "3.2e-2 (64×, the former recipe)": {"vit": SUPERVISED_64X},
        },
        "ssl_variants": {
            label: ssl_rows(Path(folder), 80) for label, folder in (s.split("=", 1) for s in args.ssl_variants)
        },
        "token_stats": json.loads(args.token_stats.read_text()) if args.token_stats else None,
    }
    write_results(args.results, "pretraining_floor.json", result)
    print(markdown(result, args.chosen or next(iter(result["supervised"]), "")))


if __name__ == "__main__":
    main()
