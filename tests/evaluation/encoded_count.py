"""``locatdino ARGV...`` counting the images the frozen encoder encodes (``FeatureExtractor`` calls): one
rank of a 2-rank command test, started by torchrun, writes its count to ``COUNTS/encoded<rank>``; in the
test's own process :func:`counted` runs the command the same way."""

import json
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


# what both segmentation commands' 2-rank tests run with besides their own options
RUNTIME_OPTIONS = [
    "--precision",
    "fp32",
    "--workers",
    "0",
    "--no-progress",
]  # fp32: bf16 features change with the batch


def counted_runs(argv: list[str], tmp_path: Path) -> tuple[dict, dict, list[int]]:
    """The first model's record of ``locatdino *argv`` in this process (``tmp_path/one``) and on 2 CPU ranks
    under torchrun (``tmp_path/two``), and the images encoded by this process, rank 0 and rank 1."""
    from tests.evaluation.ranks_fixtures import torchrun

    one_encoded = counted([*argv, "--out", str(tmp_path / "one")])
    done = torchrun(2, __file__, str(tmp_path), *argv, "--out", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("| tiny |") == 1  # rank 0 alone prints the table (of the model labelled tiny)
    one, two = (json.loads((tmp_path / out / "results.json").read_text())["models"][0] for out in ("one", "two"))
    assert sorted(p.name for p in (tmp_path / "two").rglob("*")) == sorted(
        p.name for p in (tmp_path / "one").rglob("*")
    )
    return one, two, [one_encoded, *(int((tmp_path / f"encoded{rank}").read_text()) for rank in (0, 1))]


if __name__ == "__main__":
    count = counted(sys.argv[2:])
    (Path(sys.argv[1]) / f"encoded{os.environ['RANK']}").write_text(str(count))
