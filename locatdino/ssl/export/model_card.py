"""The model card (``README.md``) of an ``export --format hf-hub`` folder: what a Hub page shows.

Written from what the checkpoint and its run folder hold: the objective and model
hyper-parameters saved in a ``fit`` checkpoint (its recipe), its step and epoch, and the held-out
scores the run logged (``hbird/*``, ``val/*`` in ``<run>/logs/version_*/metrics.csv``, stitched
over resumes as ``curves.png`` is, up to the checkpoint's step). The checkpoint and any file of the
recipe are named by their file name alone, never a local path. The front matter is timm's:
``library_name: timm`` makes the Hub offer ``timm.create_model("hf-hub:…")``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from locatdino.ssl.logs.curves import stitched_metrics

# the prefixes of held-out scores (HummingbirdMonitor, the supervised objective's validation)
_EVALUATION_PREFIXES = ("hbird/", "val/")


def logged_evaluation(checkpoint_path: str | Path, step: int | None) -> dict[str, tuple[int, float]]:
    """``{metric: (step, value)}``: the last held-out score at or before ``step`` that the run of
    ``checkpoint_path`` (``<run>/checkpoints/*.ckpt``) logged; empty when the run folder is not there."""
    checkpoints = Path(checkpoint_path).resolve().parent
    if checkpoints.name != "checkpoints":
        return {}
    found = {}
    for key, series in stitched_metrics(checkpoints.parent / "logs").items():
        kept = [(s, v) for s, v in series if step is None or s <= step]
        if key.startswith(_EVALUATION_PREFIXES) and kept:
            found[key] = kept[-1]
    return found


def model_card(
    metadata: Mapping[str, str],
    hparams: Mapping[str, Any] | None,
    evaluation: Mapping[str, tuple[int, float]],
    epoch: int | None,
) -> str:
    """The ``README.md`` text (see the module docstring)."""
    name = metadata["model"]
    steps = ""
    if metadata.get("step"):
        steps = f"step {metadata['step']}" + (f", epoch {epoch}" if epoch is not None else "")
    lines = [
        "---",
        "library_name: timm",
        "tags:",
        "- image-feature-extraction",
        "- timm",
        "- locatdino",
        "---",
        "",
        f"# {name}",
        "",
        f"The {metadata.get('network', 'backbone')} backbone of `{metadata.get('source')}`"
        + (f" ({metadata['objective']}, {steps})" if metadata.get("objective") and steps else "")
        + f", written by `locatdino export`. Trained at {metadata['img_size']} px with patch {metadata['patch_size']}; "
        "no classifier head (`num_classes=0`): `forward_features` gives the tokens, `forward` the image embedding.",
        "",
        "```python",
        "import timm",
        "import locatdino  # only for a LocAtViT: registers locatvit_* in timm",
        "",
        'model = timm.create_model("local-dir:PATH/TO/THIS/FOLDER", pretrained=True)',
        '# once pushed to the Hub: timm.create_model("hf-hub:USER/REPO", pretrained=True)',
        "```",
        "",
    ]
    recipe = {k: _without_local_paths(v) for k, v in (hparams or {}).items() if not k.startswith("_")}
    if recipe:  # through JSON: tuples as lists, anything else as its text
        lines += [
            "## Recipe",
            "",
            "The objective's settings saved in the checkpoint:",
            "",
            "```yaml",
            yaml.safe_dump(json.loads(json.dumps(recipe, default=str)), sort_keys=False).rstrip(),
            "```",
            "",
        ]
    lines += ["## Evaluation", ""]
    if evaluation:
        lines += [
            "| metric | value | at step |",
            "| --- | --- | --- |",
            *(f"| {key} | {value:.4g} | {step} |" for key, (step, value) in evaluation.items()),
            "",
        ]
    else:
        lines += ["The run logged no held-out score up to this checkpoint.", ""]
    return "\n".join(lines)


def _without_local_paths(value: Any) -> Any:
    """``value`` with every absolute path (``model.backbone_checkpoint``, the FILE of a ``NAME:FILE``
    such as ``model.teacher``) reduced to its file name: a pushed card shows how the run was made,
    not where its files lay on the user's disk."""
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(os.path.normpath(value))
    if isinstance(value, str) and os.path.isabs(value.partition(":")[2]):
        name, _, path = value.partition(":")
        return f"{name}:{os.path.basename(os.path.normpath(path))}"
    if isinstance(value, Mapping):
        return {k: _without_local_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_local_paths(v) for v in value]
    return value
