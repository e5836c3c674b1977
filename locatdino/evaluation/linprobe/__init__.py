"""``locatdino linprobe``: the paper's dense linear probe on frozen patch tokens (segmentation mIoU).

The protocol (``protocol``: cached patch tokens, the linear head of ``head``, its one-cycle
schedule, the segmentation views and transforms), the command (``cli``) and its report (``report``);
docs/evaluation.md states the protocol.
"""

from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, LinearProbeResult, linear_probe

__all__ = ["LinearProbeConfig", "LinearProbeResult", "linear_probe"]
