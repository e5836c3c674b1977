"""The ``[LABEL=]NAME[:CHECKPOINT]`` text that names a model and its weights on every command line.

Evaluation commands take it as ``--model`` (a run per model), ``export`` to name what it writes,
and pretraining to name a teacher: it lives below all of them. The text is split at its first
``:``, so a checkpoint path may hold ``:`` itself; a LABEL holds no ``:``. ``none`` or nothing
after the ``:`` means random init.
"""

from __future__ import annotations

MODEL_METAVAR = "[LABEL=]NAME[:CHECKPOINT]"


def parse_model(text: str) -> tuple[str | None, str, str | None]:
    """``(label or None, name, checkpoint or None)`` of ``[LABEL=]NAME[:CHECKPOINT]``
    (``ValueError`` naming the text when it has no name or an empty label)."""
    head, _, checkpoint = text.partition(":")
    label, has_label, name = head.partition("=") if "=" in head else (None, "", head)
    if not name or (has_label and not label):
        raise ValueError(
            f"--model {text!r}: expected {MODEL_METAVAR}, e.g. vit_small_patch16_224:dino.pth "
            "or vanilla=vit_small_patch16_224:dino.pth"
        )
    return label, name, None if checkpoint in ("", "none") else checkpoint
