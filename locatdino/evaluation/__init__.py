"""What every evaluation of a frozen backbone shares, whatever the protocol: the floor under
Hummingbird (:mod:`locatdino.retrieval`), the probes (:mod:`locatdino.probes`) and
``locatdino compare`` (:mod:`locatdino.comparison`), which import from here and never the other
way round.

- data: labelled splits by dataset name (``splits``), image views, normalisation, resizing and the
  paired memory augmentation (``views``, ``augment``);
- the frozen encoder: ``load_backbone``, ``FeatureExtractor`` with its precision and device
  choice (``features``, ``precision``), a batch cache (``feature_cache``), ``eval_mode``;
- scores: the streaming confusion-matrix mIoU (``metric``), one confusion matrix per image in one
  file format (``image_confusions``), paired-bootstrap and Wilson intervals (``bootstrap``,
  ``wilson``);
- records: provenance (``provenance``), wall time per phase (``phase_clock``), shared markdown
  cells (``tables``), and the command-line options every evaluation command shares (``options``;
  the ``--model`` grammar and the backbones it names: ``model_runs``).
"""

from locatdino.evaluation.features import FeatureExtractor, eval_mode, load_backbone
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.metric import ConfusionMatrix, IoUResult
from locatdino.evaluation.splits import open_split

__all__ = [
    "ConfusionMatrix",
    "FeatureExtractor",
    "ImageConfusions",
    "IoUResult",
    "eval_mode",
    "load_backbone",
    "open_split",
]
