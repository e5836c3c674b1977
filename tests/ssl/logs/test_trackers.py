"""Trackers beside ``fit``'s CSV log: a Weights & Biases run in offline mode and an MLflow file store
receive every metric ``metrics.csv`` holds, and ``curves.png``; nothing is contacted."""

import csv
import math
import re
from pathlib import Path

import pytest
import yaml
from jsonargparse import Namespace
from lightning.pytorch.loggers import CSVLogger
from ssl_helpers import ROOT, tiny_overrides

from locatdino.ssl.logs.trackers import CSV_LOGGER, with_csv_logger
from locatdino.ssl.run import cli

WANDB = Namespace(class_path="lightning.pytorch.loggers.WandbLogger", init_args=Namespace(offline=True))


def test_the_csv_logger_stays_beside_a_tracker():
    alone = with_csv_logger(None, "runs/x")
    assert alone.class_path == CSV_LOGGER and alone.init_args.save_dir == "runs/x"
    both = with_csv_logger(WANDB, "runs/x")
    assert [one.class_path for one in both] == [CSV_LOGGER, WANDB.class_path]
    assert with_csv_logger(both, "runs/x") is both  # already there: not twice
    assert with_csv_logger(False, "runs/x") is False


def _csv_metrics(run: Path) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    with open(run / "logs" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key not in ("step", "epoch") and value:
                series.setdefault(key, {})[int(row["step"])] = float(value)
    return series


def _mlflow_metrics(store: Path) -> dict[str, dict[int, float]]:
    """``{key: {step: value}}`` of the one run of an MLflow file store (a file per metric: ``time value step``)."""
    (run,) = [p.parent for p in store.glob("*/*/meta.yaml") if (p.parent / "metrics").is_dir()]
    series: dict[str, dict[int, float]] = {}
    for path in (run / "metrics").rglob("*"):
        if path.is_file():
            key = path.relative_to(run / "metrics").as_posix()
            if key == "epoch":  # a column of metrics.csv, not a metric
                continue
            series[key] = {
                int(step): float(value) for _, value, step in (line.split() for line in path.read_text().splitlines())
            }
    return series


@pytest.mark.slow
def test_wandb_offline_and_mlflow_get_the_csv_metrics_and_the_curves(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: list[dict] = []
    run_log = wandb.sdk.wandb_run.Run.log
    monkeypatch.setattr(
        wandb.sdk.wandb_run.Run,
        "log",
        lambda self, data, *a, **kw: logged.append(dict(data)) or run_log(self, data, *a, **kw),
    )
    loggers = [
        {
            "class_path": "lightning.pytorch.loggers.WandbLogger",
            "init_args": {"offline": True, "project": "locatdino", "save_dir": str(tmp_path / "wandb")},
        }
    ]
    mlflow = None
    try:
        import mlflow
    except ImportError:
        pass
    if mlflow is not None:
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        loggers.append(
            {
                "class_path": "lightning.pytorch.loggers.MLFlowLogger",
                "init_args": {"experiment_name": "locatdino", "tracking_uri": f"file:{tmp_path / 'mlruns'}"},
            }
        )
    config = tmp_path / "trackers.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "logger": loggers,
                    "callbacks": [
                        {
                            "class_path": "locatdino.evaluation.hbird.HummingbirdMonitor",
                            "init_args": {
                                "every_n_steps": 2,
                                "num_train": 4,
                                "num_val": 2,
                                "input_size": 32,
                                "k": 10,
                                "batch_size": 4,
                            },
                        }
                    ],
                }
            }
        )
    )
    assert cli.main([*tiny_overrides(tmp_path), "--config", str(config), "--trainer.max_steps", "4"]) == 0

    run = tmp_path / "run"
    want = _csv_metrics(run)
    for key in (
        "train/loss",
        "train/lr",
        "train/wd",
        "train/teacher_momentum",
        "train/teacher_temp",
        "teacher/entropy",
        "teacher/batch_entropy",
        "hbird/mIoU",
    ):
        assert key in want, key
    got_wandb: dict[str, dict[int, float]] = {}
    for data in logged:
        for key, value in data.items():
            if isinstance(value, (int, float)) and key not in ("trainer/global_step", "epoch"):
                got_wandb.setdefault(key, {})[int(data["trainer/global_step"])] = float(value)
    trackers = {"wandb": got_wandb, **({"mlflow": _mlflow_metrics(tmp_path / "mlruns")} if mlflow else {})}
    for name, got in trackers.items():
        assert got.keys() == want.keys(), name
        for key, steps in want.items():
            assert got[key].keys() == steps.keys(), (name, key)
            assert all(math.isclose(got[key][s], v, rel_tol=1e-6) for s, v in steps.items()), (name, key)

    # the figure: an image in the W&B run's media, an artifact of the MLflow run
    assert (run / "curves.png").is_file()
    assert [d for d in logged if "curves" in d]
    (offline,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    assert [
        p for p in (offline / "files" / "media" / "images").glob("curves_*.png") if p.read_bytes()[:4] == b"\x89PNG"
    ]
    assert next(offline.glob("run-*.wandb")).stat().st_size > 0
    if mlflow:
        assert len(list((tmp_path / "mlruns").glob("*/*/artifacts/curves.png"))) == 1


DOCS_EXAMPLE = re.compile(r"^\s*(WANDB_MODE=offline locatdino fit .*)$", re.MULTILINE)


def test_the_docs_tracker_example_builds_a_wandb_logger_beside_the_csv_one(tmp_path, monkeypatch):
    """docs/pretraining.md's W&B command, parsed and built (no run: nothing is logged)."""
    import shlex

    from lightning.pytorch.loggers import WandbLogger

    pytest.importorskip("wandb")
    (line,) = DOCS_EXAMPLE.findall((ROOT / "docs" / "pretraining.md").read_text())
    argv = shlex.split(line)[3:]  # after "WANDB_MODE=offline locatdino fit"
    monkeypatch.chdir(tmp_path)
    built = cli.build_cli(argv, run=False)
    assert [type(one) for one in built.trainer.loggers] == [CSVLogger, WandbLogger]
    assert built.trainer.loggers[0].log_dir.endswith("logs/version_0")
    assert built.trainer.loggers[1]._offline


def test_curves_reach_tensorboard_as_an_image(tmp_path):
    """The TensorBoard branch of ``log_image``: the PNG's pixels in the event file, at its step."""
    pytest.importorskip("tensorboard")
    import numpy as np
    from lightning.pytorch.loggers import TensorBoardLogger
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from locatdino.ssl.logs.trackers import log_image

    png = tmp_path / "curves.png"
    Image.fromarray(np.arange(6 * 5 * 3, dtype=np.uint8).reshape(6, 5, 3)).save(png)
    logger = TensorBoardLogger(tmp_path / "tb", name="run")
    assert log_image(logger, "curves", png, step=7)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    (image,) = events.Images("curves")
    assert (image.step, image.width, image.height) == (7, 5, 6)
    assert not log_image(CSVLogger(tmp_path), "curves", png, step=7)  # the file itself is the record


def test_a_tracker_whose_package_is_missing_names_the_extra(tmp_path, capsys, monkeypatch):
    """It said "Not a valid subclass of Logger" for a Lightning logger that is one."""
    import importlib.util

    from locatdino import cli as command_line
    from locatdino.ssl.logs.trackers import missing_tracker

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    assert missing_tracker("lightning.pytorch.loggers.WandbLogger") is None or find_spec("wandb") is None
    assert missing_tracker("a CSVLogger") is None
    logger = "lightning.pytorch.loggers.MLFlowLogger"
    assert missing_tracker(logger) == (
        "trainer.logger: MLFlowLogger needs the mlflow package, which is not installed: pip install 'locatdino[mlflow]'"
    )
    if find_spec("mlflow") is None:  # as a user without mlflow meets it, before anything is built
        capsys.readouterr()
        try:
            status = command_line.main(["fit", *tiny_overrides(tmp_path), "--trainer.logger", logger])
        except SystemExit as done:  # the parser's usage errors
            status = done.code
        err = capsys.readouterr().err.strip()
        assert status == 1 and "\n" not in err and "Traceback" not in err, err
        assert err.startswith(f"locatdino fit: {missing_tracker(logger)}"), err
