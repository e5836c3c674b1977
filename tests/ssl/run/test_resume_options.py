"""A run resumes with the config's ``compile`` and ``grad_checkpointing``: they change how a step is
computed, not what is trained (a compiled run resumed eager was refused as "trained with other
settings", and Lightning would have taken the checkpoint's values over the config's)."""

import torch
from ssl_helpers import tiny_overrides

from locatdino.ssl.run import cli


def test_a_compiled_run_resumes_eager(tmp_path):
    args = tiny_overrides(tmp_path)
    assert cli.main([*args, "--trainer.max_steps", "1"]) == 0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["hyper_parameters"]["compile"] is False
    ckpt["hyper_parameters"].update(compile=True, grad_checkpointing=True)  # as a compiled run saves it
    torch.save(ckpt, last)
    assert cli.main([*args, "--trainer.max_steps", "2", "--ckpt_path", "last"]) == 0
    resumed = torch.load(last, weights_only=False)
    assert resumed["global_step"] == 2
    assert resumed["hyper_parameters"]["compile"] is False  # the config's: not compiled
    assert resumed["hyper_parameters"]["grad_checkpointing"] is False
