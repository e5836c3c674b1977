"""What the 2-rank worker (``ranks_worker.py``) and the test comparing it with one process both build."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from locatdino.evaluation.class_splits import LabelledImages
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model

ROOT = Path(__file__).resolve().parents[2]
# what says "a launcher started this process": the pytest process's own must not reach the launched ranks
LAUNCH_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "GROUP_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_ID",
    "SLURM_JOB_NAME",
)
# the scenes of the commands' 2-rank tests: shares of 12 and 11 train images
SCENE_OPTIONS = [
    "--dataset",
    "scenes",
    "--num-train",
    "23",
    "--num-val",
    "9",
    "--scene-size",
    "64",
    "--input-size",
    "32",
]
TABLE_ROWS = 9  # 2 ranks: shares of 5 and 4
DROPPED_ROWS = (2, 3)  # both in rank 0's share: the ranks send 3 and 4 rows
SCENES = 7  # 2 ranks: shares of 4 and 3
BROKEN_SCENE = 4  # in rank 1's share: the ranks encode 4 and 2 images


def kept_rows(share: range) -> list[int]:
    return [i for i in share if i not in DROPPED_ROWS]


def labelled_scenes() -> LabelledImages:
    """``SCENES`` built-in scenes at 32 px labelled by their dominant class; scene ``BROKEN_SCENE``
    does not decode."""
    from locatdino.data import ScenesSegmentation
    from locatdino.data.scenes import SCENE_CLASSES, scene_class

    scenes = [ScenesSegmentation(SCENES, size=32, seed=0, split="train")[i] for i in range(SCENES)]

    def load(i: int):
        if i == BROKEN_SCENE:
            raise OSError(f"scene {i}: truncated")
        return scenes[i][0]

    labels = np.array([scene_class(np.asarray(mask)) for _, mask in scenes], np.int64)
    return LabelledImages(labels, list(SCENE_CLASSES), load, lambda i: f"scene {i}")


def tiny_encoder():
    return tiny_vit_model()


def torchrun(ranks: int, *program: str) -> subprocess.CompletedProcess:
    """``program`` (a script and its arguments, or ``-m module ...``) on ``ranks`` CPU ranks started by
    torchrun on this machine (gloo over loopback), with this checkout first on the ranks' path."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    launch += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    return subprocess.run([*launch, *program], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def one_and_two_ranks(argv: list[str], tmp_path: Path) -> tuple[dict, dict, subprocess.CompletedProcess]:
    """The first model's record in ``results.json`` of ``locatdino *argv`` in this process (``tmp_path/one``)
    and on 2 CPU ranks under torchrun (``tmp_path/two``), and the 2-rank run's process."""
    from locatdino import cli

    assert cli.main([*argv, "--out", str(tmp_path / "one")]) == 0
    done = torchrun(2, "-m", "locatdino", *argv, "--out", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads((tmp_path / out / "results.json").read_text())["models"][0] for out in ("one", "two"))
    return one, two, done
