"""locatdino: DINO pretraining with LocAtViT backbones and Hummingbird in-context segmentation.

Importing the package registers the LocAtViT variants in timm's model registry, so
``timm.create_model("locatvit_small_patch16_224")`` works after ``import locatdino``.
"""

__version__ = "0.1.0"

from locatdino.common.threads import drop_invalid_thread_env  # noqa: E402

drop_invalid_thread_env()  # before torch's OpenMP runtime reads OMP_NUM_THREADS (locatdino.common.threads)

from locatdino import models  # noqa: E402,F401  (registers timm entries)
