"""``locatdino ARGV...`` counting the images the frozen encoder encodes (``FeatureExtractor`` calls): one
rank of a 2-rank command test, started by torchrun, writes its count to ``COUNTS/encoded<rank>``; in the
test's own process :func:`counted` runs the command the same way."""

import os
import sys
from pathlib import Path

from locatdino import cli
from locatdino.evaluation.features import FeatureExtractor


def counted(argv: list[str]) -> int:
    """The images ``locatdino *argv`` encoded in this process (the command must succeed)."""
    seen, call = [0], FeatureExtractor.__call__

    def counting(self, images):
        seen[0] += len(images)
        return call(self, images)

    FeatureExtractor.__call__ = counting
    try:
        assert cli.main(argv) == 0
    finally:
        FeatureExtractor.__call__ = call
    return seen[0]


if __name__ == "__main__":
    count = counted(sys.argv[2:])
    (Path(sys.argv[1]) / f"encoded{os.environ['RANK']}").write_text(str(count))
