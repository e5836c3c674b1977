"""``locatdino hbird``: the Hummingbird benchmark from the command line.

    locatdino hbird --model vit_small_patch16_224 --checkpoint dino_vits16.pth \\
        --model locatvit_small --checkpoint last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012
    locatdino hbird report runs/a runs/b --out comparison.md

Several ``--model`` (each with its ``--checkpoint``, ``none`` for random init) are evaluated on
the same memory views and compared in one report. One model writes ``OUT/results.json`` and
``OUT/summary.md``; several write ``OUT/<model>/...`` per run plus ``OUT/summary.md`` comparing
them. ``report`` rebuilds a comparison from existing ``results.json`` files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from locatdino.output_files import DiskFullError, atomic_write_text, ensure_writable, remove_stale_temporaries
from locatdino.retrieval.evaluate import HummingbirdConfig, hummingbird
from locatdino.retrieval.protocol_options import (add_data_arguments, add_model_arguments, add_protocol_arguments,
                                                  config_from_args, encoder_device, load_backbones, model_runs,
                                                  record_run)
from locatdino.retrieval.report import (differing_settings, incompatibilities, label_by_folder, load_results,
                                        results_table, summary_markdown, write_run)
from locatdino.retrieval.splits import open_split


def _parser() -> argparse.ArgumentParser:
    d = HummingbirdConfig()
    p = argparse.ArgumentParser(
        prog="locatdino hbird",
        description="Hummingbird in-context segmentation: label each query patch from its k nearest "
        "labelled memory patches (frozen encoder, FAISS k-NN), report mIoU. "
        "`locatdino hbird report RESULTS...` compares finished runs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_arguments(p)
    add_data_arguments(p)
    add_protocol_arguments(p)
    p.add_argument("--memory-dtype", choices=("float32", "float16"), default=d.memory_dtype,
                   help="stored features (memory-dir banks, non-Flat indices)")
    p.add_argument("--memory-dir", default=None, help="memory-map the memory bank into this directory")
    p.add_argument("--out", default="hbird_results", metavar="DIR", help="results.json + summary.md")
    return p


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="locatdino hbird report",
                                description="Compare finished Hummingbird runs (refused when they scored "
                                "different query images; differing settings are marked).")
    p.add_argument("results", nargs="+", help="results.json files or directories holding them")
    p.add_argument("--out", default=None, help="also write the markdown comparison here")
    p.add_argument("--label", action="append", default=[],
                   help="name of each run, in the order found (default: its run folder); one per run")
    p.add_argument("--allow-mixed", action="store_true",
                   help="compare runs of different datasets, splits or query counts anyway (marked)")
    return p


def _memory_dir(args: argparse.Namespace, label: str, single: bool) -> str | None:
    """The bank folder of one run: ``--memory-dir`` itself, or one sub-folder per model."""
    return None if args.memory_dir is None else str(Path(args.memory_dir) / ("" if single else label))


def _check_outputs(args: argparse.Namespace, runs: list[tuple[str, str | None, str]]) -> None:
    """Fail before any work when an output folder cannot be written: the results come last, and
    a memory bank is staged next to its folder. Stale temporaries of killed runs go first."""
    single = len(runs) == 1
    folders = [(Path(args.out) if single else Path(args.out) / label, "--out") for *_, label in runs]
    if args.memory_dir is not None:
        folders += [(Path(_memory_dir(args, label, single)).parent, "--memory-dir") for *_, label in runs]
    try:
        for folder, flag in folders:
            ensure_writable(folder, flag)
            remove_stale_temporaries(folder)
    except OSError as err:
        raise SystemExit(f"locatdino hbird: {err}") from None


def report_main(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    try:
        results = load_results(args.results)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    labels = args.label or label_by_folder(results)
    if len(labels) != len(results):
        raise SystemExit(f"locatdino hbird report: {len(labels)} --label for {len(results)} runs "
                         f"({', '.join(r['source'] for r in results)})")
    mixed = incompatibilities(results)
    if mixed and not args.allow_mixed:
        raise SystemExit(f"locatdino hbird report: the runs scored different query images ({'; '.join(mixed)}); "
                         "compare like with like, or pass --allow-mixed")
    for r, label in zip(results, labels):
        r["label"] = label
    for line in differing_settings(results):
        print(f"locatdino hbird report: warning: {line}", file=sys.stderr)
    print(results_table(results))
    if args.out:
        atomic_write_text(args.out, summary_markdown(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    args = _parser().parse_args(argv)
    runs = model_runs(args, "hbird")
    device = encoder_device(args.device, "hbird")
    try:
        config_from_args(args, None)  # inconsistent settings fail before any data is read
        common = dict(seed=args.seed, scene_size=args.scene_size)
        train_set = open_split(args.dataset, args.data_dir, args.train_split, args.num_train,
                               default_scenes=300, **common)
        val_set = open_split(args.dataset, args.data_dir, args.val_split, args.num_val,
                             default_scenes=100, **common)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None
    models = load_backbones(runs, args.seed, args.input_size)  # a bad model creates no output folder
    _check_outputs(args, runs)
    out = Path(args.out)
    results = []
    for (name, ckpt, _, label), model in zip(runs, models):
        single = len(runs) == 1
        cfg = config_from_args(args, _memory_dir(args, label, single))
        print(f"[hbird] {label}: memory {len(train_set)} images x {cfg.aug_epochs} views, "
              f"{len(val_set)} queries, {cfg.input_size} px, index {cfg.index}", file=sys.stderr)
        try:  # a bank too large for --memory-dir fails before encoding, reserving its disk space
            result = record_run(hummingbird(model.to(device), train_set, val_set, cfg).to_dict(), args, name, ckpt,
                                label, model)
            write_run(result, out if single else out / label)
        except DiskFullError as err:
            raise SystemExit(f"locatdino hbird: {err}") from None
        results.append(result)
    if len(results) > 1:
        atomic_write_text(out / "summary.md", summary_markdown(results, "Hummingbird comparison"))
    print(results_table(results))
    print(f"[hbird] results written to {out}", file=sys.stderr)
    return 0
