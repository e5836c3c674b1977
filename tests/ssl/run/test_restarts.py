"""A restarted job (torchrun's elastic agent, a requeued SLURM job) resumes its run folder's
last.ckpt by itself; a first start, an explicit ckpt_path or a folder without last.ckpt does not."""

import pytest
from jsonargparse import Namespace

from locatdino.ssl.run.restarts import record_elastic_job, restart_of, resume_after_restart


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"TORCHELASTIC_RESTART_COUNT": "0"}, None),
        ({"SLURM_RESTART_COUNT": "0"}, None),
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, "restart 2 of this job by torchrun"),
        ({"SLURM_RESTART_COUNT": "1"}, "restart 1 of this job by SLURM"),
        ({"SLURM_RESTART_COUNT": ""}, None),
        ({"TORCHELASTIC_RUN_ID": "job-7"}, None),
    ],
)
def test_restart_of(environ, expected):
    assert restart_of(environ) == expected


def config(root, ckpt_path=None):
    return Namespace(ckpt_path=ckpt_path, trainer=Namespace(default_root_dir=str(root)))


def test_a_restart_resumes_last_and_says_so(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    resumed = config(tmp_path)
    resume_after_restart(resumed, {"TORCHELASTIC_RESTART_COUNT": "1"})
    assert resumed.ckpt_path == "last"
    assert capsys.readouterr().err == (
        f"locatdino fit: restart 1 of this job by torchrun: resuming {tmp_path}/checkpoints/last.ckpt\n"
    )


@pytest.mark.parametrize(
    ("environ", "ckpt_path", "has_last"),
    [
        ({}, None, True),  # a first start: the folder check refuses it, as before
        ({"SLURM_RESTART_COUNT": "1"}, "other.ckpt", True),  # what the command says wins
        ({"SLURM_RESTART_COUNT": "1"}, None, False),
    ],
)  # failed before its first checkpoint: starts again
def test_no_resume_otherwise(tmp_path, environ, ckpt_path, has_last):
    if has_last:
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    unchanged = config(tmp_path, ckpt_path)
    resume_after_restart(unchanged, environ)
    assert unchanged.ckpt_path == ckpt_path


def test_an_elastic_restart_whose_counter_says_0_is_known_by_its_rendezvous_id(tmp_path, capsys):
    """An agent that restarts its workers because another node failed may leave
    TORCHELASTIC_RESTART_COUNT at 0: the id the first start recorded tells the restart."""
    first = {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert restart_of(first, str(tmp_path)) is None  # nothing recorded yet: a first start
    record_elastic_job(str(tmp_path), first)
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert restart_of(first, str(tmp_path)) == "restart of this job (rendezvous id job-7) by torchrun"
    assert restart_of({**first, "TORCHELASTIC_RUN_ID": "job-8"}, str(tmp_path)) is None  # another job
    assert restart_of({"TORCHELASTIC_RUN_ID": "none"}, str(tmp_path)) is None  # static torchrun
    resumed = config(tmp_path)
    resume_after_restart(resumed, first)
    assert resumed.ckpt_path == "last"
    assert capsys.readouterr().err.endswith(f"by torchrun: resuming {tmp_path}/checkpoints/last.ckpt\n")
    record_elastic_job(str(tmp_path), {"TORCHELASTIC_RUN_ID": "none"})  # static torchrun records nothing
    assert (tmp_path / "checkpoints" / "elastic_job").read_text() == "job-7\n"
