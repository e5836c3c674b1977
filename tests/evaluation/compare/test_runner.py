import json
from fractions import Fraction

import numpy as np
import pytest
import torch

from locatdino.evaluation.compare import cli as compare_cli
from locatdino.evaluation.compare.measure import memory_sizes
from locatdino.evaluation.feature_cache import CachedExtractor
from locatdino.evaluation.features import FeatureExtractor
from tests.evaluation.results_schema import valid_results

TINY = [
    "--num-train",
    "8",
    "--num-val",
    "3",
    "--scene-size",
    "64",
    "--input-size",
    "64",
    "--k",
    "5",
    "--workers",
    "0",
    "--no-progress",
    "--figure-images",
    "2",
    "--batch-size",
    "8",
    "--linprobe-iters",
    "6",
]


def test_memory_sizes_are_fractions_of_the_full_memory():
    fractions = [Fraction(1), Fraction(1, 4), Fraction(1, 16)]
    # 160 patches from 10 views: 1/16 -> 10 patches (one per view) is kept at k 5, not at k 30
    assert memory_sizes(fractions, 160, 10, 5) == [(Fraction(1, 16), 10), (Fraction(1, 4), 40)]
    assert memory_sizes(fractions, 160, 10, 30) == [(Fraction(1, 4), 40)]
    assert memory_sizes(fractions, 150, 10, 5) == [(Fraction(1, 4), 37)]  # 1/16 -> 9 < one per view


def test_feature_cache_computes_each_batch_once(tiny_vit):
    calls = []

    class Counting(FeatureExtractor):
        def __call__(self, images):
            calls.append(1)
            return super().__call__(images)

    cached = CachedExtractor(Counting(tiny_vit))
    a = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    b = a.clone()
    b[0, 0, 0, 0] ^= 1
    first = cached(a)
    torch.testing.assert_close(cached(a.clone()), first)
    assert not torch.equal(cached(b), first) and len(calls) == 2 and cached.hits == 1


@pytest.mark.slow
def test_one_unreadable_checkpoint_fails_alone(tmp_path, capsys):
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint")
    out = tmp_path / "cmp"
    argv = [
        "--model",
        "vit=vit_tiny_patch16_224",
        "--model",
        f"bad=vit_tiny_patch16_224:{bad}",
        "--model",
        "locat=locatvit_tiny_patch16_224:none",
        "--out",
        str(out),
        "--baselines",
        *TINY,
    ]
    assert compare_cli.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    err_lines = [line for line in err if line.startswith("locatdino compare:")]
    assert len(err_lines) == 1 and "'bad'" in err_lines[0] and str(bad) in err_lines[0]
    # every model is loaded and checked before the first evaluation: the failure is known at once
    assert err.index(err_lines[0]) < min(i for i, line in enumerate(err) if "Hummingbird" in line)

    report = valid_results(out / "results.json", "compare")
    assert [m["spec"]["name"] for m in report["models"]] == ["vit", "locat", "pixels", "position-prior"]
    assert list(report["failed"]) == ["bad"]
    vit, locat, pixels, prior = report["models"]
    # the baselines: on vit's 16 px grid, Δ to the first model with intervals, n/a where a network is needed
    assert pixels["hbird"]["memory_patches"] == vit["hbird"]["memory_patches"]  # the same memory views
    assert prior["hbird"]["memory_patches"] == 8 * 4 * 4  # every patch of the 8 whole memory images
    assert set(pixels["differences"][""]) == set(prior["differences"][""]) == {"miou", "miou_matched", "linprobe"}
    assert pixels["linprobe"]["features"]["dim"] == 3 * 16 * 16 and prior["linprobe"]["features"]["dim"] == 4 * 4
    assert pixels["parameters"] is None and pixels["not_applicable"]["probes"].startswith("no class token")
    assert vit["not_applicable"] == {} and vit["baseline"] is None
    assert 0 <= vit["hbird"]["miou"] <= 100 and vit["parameters"] == 5_524_416
    assert locat["parameters"] - vit["parameters"] == 12 * (3 * 64 + 3)  # GAug: 3 d_h + 3 per block
    # the full memory holds the patches that are mostly image (zoom-out crops pad), at most 8 x 16;
    # a fraction f keeps floor(f x full / 8) patches per view; 1/16 leaves less than one per view
    curve = vit["memory_curve"]
    full = vit["hbird"]["memory_patches"]
    assert [p["fraction"] for p in curve] == ["1/4", "1"] and 64 <= full <= 128 and curve[1]["memory_patches"] == full
    assert curve[0]["memory_patches"] <= 8 * (full // 4 // 8) and curve[0]["memory_patches"] > 0
    assert vit["locality"] is None and len(locat["locality"]) == 12
    probes = vit["probes"]
    assert probes["num_train"] == 8 and probes["num_test"] == 3 and 0 <= probes["knn_top1"] <= 100
    linear = vit["linprobe"]  # the dense linear probe, trained on the memory images, scored on the queries
    assert linear["iterations"] == 6 and linear["num_train"] == 8 and linear["num_val"] == 3
    assert 0 <= linear["miou"] <= 100 and linear["features"]["cached"]
    assert (out / linear["per_image_confusion"]).is_file()  # for the paired interval of the linear probe
    assert report["config"]["linprobe"]["batch_size"] == 8 and report["config"]["linprobe"]["augment"] == "off"
    md = (out / "report.md").read_text()
    assert "**bad failed**" in md and "| vit |" in md and "| locat |" in md
    assert "| pixels | pixels | none (no network) |" in md and md.count("| n/a | n/a | n/a | n/a | n/a |") == 2
    # intervals to the first model, from per-image matrices of the 3 queries and hits of the 3 test images
    assert (
        set(locat["differences"][""]) == {"miou", "miou_matched", "linprobe", "knn_top1", "logistic_top1"}
        and "differences" not in vit
    )
    assert len(vit["probes"]["knn_hits"]) == 3 and (out / vit["hbird"]["per_image_confusion"]).is_file()
    assert "## Differences to vit" in md and "Hummingbird mIoU: " in md
    assert "Δ linear probe" in md and f"| {linear['miou']:.2f} | +0.00 |" in md
    for path in report["figures"].values():
        assert (out / path).stat().st_size > 1000 and (out / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"figures/locality.png", "figures/predictions.png"} <= set(report["figures"].values())

    with pytest.raises(SystemExit, match="holds the output of an earlier run"):  # never overwritten silently
        compare_cli.main(argv)
    from locatdino.common.output_folder import RECORD_NAME, OutputFolder

    written = sorted(
        str(p.relative_to(out))
        for p in out.rglob("*")
        if p.is_file() and p.name not in (RECORD_NAME, ".locatdino.lock")
    )
    assert sorted(OutputFolder(out, "compare").earlier()) == written  # every file it wrote is recorded


def test_protocol_options_are_hbird_s(tmp_path):
    """compare takes the Hummingbird options of hbird, with the same defaults and meaning."""
    from locatdino.evaluation.hbird import cli as hbird_cli
    from locatdino.evaluation.hbird.options import HBIRD_TABLE, config_from_args

    options = [
        "--augment",
        "off",
        "--aug-epochs",
        "1",
        "--no-norm",
        "--hungarian",
        "pixels",
        "--knn-backend",
        "faiss",
        "--eval-resolution",
        "input",
        "--seed",
        "3",
    ]
    compared = config_from_args(compare_cli._parser().parse_args(["--model", "a=vit_tiny_patch16_224", *options]))
    evaluated = config_from_args(
        hbird_cli._parser().parse_args(["--model", "vit_tiny_patch16_224", *options]), HBIRD_TABLE
    )
    assert compared == evaluated
    assert (compared.augment, compared.norm, compared.hungarian, compared.seed) == ("off", False, "pixels", 3)
    defaults = [
        config_from_args(compare_cli._parser().parse_args(["--model", "a=m"])),
        config_from_args(hbird_cli._parser().parse_args(["--model", "m"]), HBIRD_TABLE),
    ]
    assert defaults[0] == defaults[1]


def _colour_folder_shards(root, split):
    """ImageFolder-style shards of one split: class 'red' and class 'blue', 6 noisy images each."""
    from PIL import Image

    from locatdino.data.shards.sources import build_source
    from locatdino.data.shards.writer import write_shards

    rng = np.random.default_rng(len(split))
    for name, colour in (("blue", (0, 0, 200)), ("red", (200, 0, 0))):
        (root / split / "images" / name).mkdir(parents=True)
        for i in range(6):
            pixels = np.clip(np.array(colour) + rng.normal(0, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / split / "images" / name / f"{i}.png")
    write_shards(build_source(str(root / split / "images")), root / "shards" / split, workers=1, progress=False)


@pytest.mark.slow
def test_imagefolder_shards_get_class_token_probes_only(tmp_path):
    from locatdino.data.shards.labels import ShardImageLabels

    for split in ("train", "val"):
        _colour_folder_shards(tmp_path, split)
    labelled = ShardImageLabels(str(tmp_path / "shards" / "train"))
    assert len(labelled) == 12 and labelled.class_names == ["blue", "red"]
    assert sorted(labelled.label(i) for i in range(12)) == [0] * 6 + [1] * 6
    out = tmp_path / "cmp"
    argv = [
        "--model",
        "vit=vit_tiny_patch16_224",
        "--dataset",
        "shards",
        "--data-dir",
        str(tmp_path / "shards"),
        "--input-size",
        "32",
        "--out",
        str(out),
        "--no-progress",
        "--workers",
        "0",
    ]
    assert compare_cli.main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    (vit,) = report["models"]
    assert vit["hbird"] is None and vit["probes"]["num_train"] == 12 and vit["probes"]["num_test"] == 12
    assert vit["linprobe"] is None and report["config"]["linprobe"] is None  # no masks: nothing to probe
    assert vit["probes"]["knn_top1"] == 100.0  # red vs blue: even random class tokens separate them
    assert set(report["figures"].values()) == {"figures/attention.png"}
    assert "class-token probes only" in (out / "report.md").read_text()
    with pytest.raises(
        SystemExit,
        match="^locatdino compare: --baselines needs segmentation masks: these shards have image labels only$",
    ):
        compare_cli.main([str(tmp_path / "other") if a == str(out) else a for a in argv] + ["--baselines"])


def test_headline_table_has_the_linear_probe_and_its_delta():
    from locatdino.evaluation.compare.report import headline_table

    def model(name, hbird, linear):
        return {
            "spec": {"name": name, "model": "m", "checkpoint": None},
            "model": {"label": name, "name": "m", "checkpoint": None},
            "scores": {"": {}},
            "parameters": 1,
            "hbird": {"miou": hbird, "miou_matched": hbird},
            "linprobe": linear and {"miou": linear},
        }

    rows = headline_table([model("a", 20.0, 30.0), model("b", 21.0, 27.5), model("c", 19.0, None)]).splitlines()
    assert "| linear probe mIoU | Δ linear probe [95 %] |" in rows[0]
    assert "| 20.00 | +0.00 | 20.00 | 30.00 | +0.00 |" in rows[2]
    assert "| 21.00 | +1.00 | 21.00 | 27.50 | -2.50 |" in rows[3]
    assert "| 19.00 | -1.00 | 19.00 | – | – |" in rows[4]  # --no-linprobe, or a failed probe


@pytest.mark.parametrize("kept", ["report.md", "figures/pca.png", "per_image_confusion/model0.npz"])
def test_a_file_compare_did_not_write_is_kept_even_with_overwrite(tmp_path, kept):
    """Only report.json was checked: a folder with the user's report.md or figures was replaced."""
    out = tmp_path / "cmp"
    (out / kept).parent.mkdir(parents=True, exist_ok=True)
    (out / kept).write_bytes(b"the user's")
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as refused:
            compare_cli.main(
                [
                    "--model",
                    "a=vit_tiny_patch16_224",
                    "--out",
                    str(out),
                    "--num-train",
                    "2",
                    "--num-val",
                    "1",
                    *overwrite,
                ]
            )
        assert str(refused.value) == (
            f"locatdino compare: --out {out} holds {kept}, which locatdino compare did not "
            "write: move it or choose another --out (a run replaces only files it wrote)"
        )
    assert (out / kept).read_bytes() == b"the user's"


def test_a_model_named_like_a_baseline_is_refused_with_baselines(tmp_path):
    with pytest.raises(
        SystemExit,
        match="^locatdino compare: with --baselines the names pixels and position-prior "
        "are the baselines' rows: rename the model$",
    ):
        compare_cli.main(["--model", "pixels=vit_tiny_patch16_224", "--baselines", "--out", str(tmp_path / "c")])
    assert not (tmp_path / "c").exists()


def test_linprobe_budget_is_checked_before_the_first_model(tmp_path, capsys):
    """``--linprobe-iters 2`` named linprobe's --iters; a batch above the memory images ran a model first."""
    argv = [
        "--model",
        "a=vit_tiny_patch16_224",
        "--out",
        str(tmp_path / "c"),
        "--num-train",
        "3",
        "--num-val",
        "1",
        "--scene-size",
        "32",
        "--input-size",
        "32",
    ]
    with pytest.raises(SystemExit):
        compare_cli.main([*argv, "--linprobe-iters", "2"])
    assert "--linprobe-iters: must be at least 5, got 2" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="batch size \\(--linprobe-batch-size\\) 8 is more than the 3 training images"):
        compare_cli.main(argv)
