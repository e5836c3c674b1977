"""Progress in a log file: whole lines, no carriage return, no cursor escape (``locatdino.common.progress``,
``locatdino.ssl.logs.progress``)."""

import io

from locatdino.common.progress import LogLines, progress
from locatdino.ssl.logs.progress import LineProgressBar, wants_line_progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _clean_lines(text: str) -> list[str]:
    assert "\r" not in text and "\x1b[" not in text, repr(text[:200])
    assert text.endswith("\n")
    return text.splitlines()


def test_a_bar_in_a_file_prints_a_start_line_lines_at_intervals_and_an_end_line():
    log = io.StringIO()
    outer = progress(total=4, desc="memory", file=log)  # default interval: only start and end
    inner = progress(range(4), desc="batches", file=log, position=1, leave=False)
    assert isinstance(outer, LogLines) and isinstance(inner, LogLines)
    for _ in inner:
        outer.update(1)
    outer.close()
    lines = _clean_lines(log.getvalue())
    assert [line.split(":")[0] for line in lines] == ["memory", "batches", "batches", "memory"]
    assert lines[2].startswith("batches: 100%") and "4/4" in lines[2] and "4/4" in lines[3]
    every = io.StringIO()
    for _ in progress(range(3), desc="query", file=every, mininterval=0):  # an interval of 0: every update
        pass
    assert len(_clean_lines(every.getvalue())) == 5  # start, 1/3, 2/3, 3/3, end
    assert not isinstance(progress(range(2), file=Terminal()), LogLines)  # a person watches: tqdm's bar
    assert progress(range(2), file=io.StringIO(), disable=True).disable


def test_fit_logs_plain_lines_when_stdout_is_not_a_terminal(tmp_path, capsys):
    import lightning.pytorch as pl

    from tests.ssl.ssl_helpers import batches_loader, random_batch, tiny_module

    assert wants_line_progress({"enable_progress_bar": True, "callbacks": None})  # capsys: not a terminal
    assert not wants_line_progress({"enable_progress_bar": False})
    assert not wants_line_progress({"callbacks": [LineProgressBar()]})
    trainer = pl.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[LineProgressBar(interval=0)],
        default_root_dir=tmp_path,
    )
    trainer.fit(tiny_module(), batches_loader([random_batch(seed=i) for i in range(3)]))
    lines = _clean_lines(capsys.readouterr().out)
    fit = [line for line in lines if line.startswith("[fit]")]
    assert [line.split(":")[0] for line in fit] == ["[fit] training"] * 4 + ["[fit] done"]  # start, 3 steps, end
    assert fit[0].startswith("[fit] training: step 0/3, epoch 0, 00:00:0")
    assert fit[-1].startswith("[fit] done: step 3/3") and "train/loss" in fit[-1]
