"""Evaluation of frozen backbones: one sub-package per command on one floor.

The commands, each in the folder named after it: ``hbird`` (Hummingbird in-context
segmentation), ``linprobe`` (the paper's dense linear probe), ``knn`` (DINO's weighted k-NN),
``lincls`` (linear classification of class tokens) and ``compare`` (several models side by side,
built on the others). They import from the floor below and never from each other, except
``compare``, which stands on all of them.

The floor (the modules of this package itself), whatever the protocol:

- data: labelled splits by dataset name (``splits``, ``class_splits``, ``train_lists``), image
  views, normalisation, resizing and the paired memory augmentation (``views``, ``augment``);
- the frozen encoder: ``load_backbone``, ``FeatureExtractor`` with its precision and device
  choice (``features``, ``precision``), a batch cache (``feature_cache``), ``eval_mode``, the class
  embeddings of a labelled split (``class_features``, ``class_token``);
- scores: the streaming confusion-matrix mIoU (``metric``), one confusion matrix per image in one
  file format (``image_confusions``), DINO's weighted k-NN vote (``knn_classifier``) on the k-NN
  search (``torch_knn``), paired-bootstrap and Wilson intervals (``bootstrap``, ``wilson``);
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
