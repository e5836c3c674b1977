"""The one output of every evaluation command (``results.json`` + ``report.md``) and the one runner."""

import json

import jsonschema
import numpy as np
import pytest

from locatdino.common.errors import UserError
from locatdino.common.output_folder import OutputFolder
from locatdino.evaluation.bootstrap import PairedInterval
from locatdino.evaluation.options import add_data_arguments
from locatdino.evaluation.results import (
    RESULTS_SCHEMA,
    ReportLayout,
    check_document,
    delta_column,
    report_markdown,
    results_document,
    score,
    score_column,
    value_column,
)
from locatdino.evaluation.runner import Protocol, Scored, run


def _record(label, value, interval=(40.0, 50.0), **extra):
    return {
        "model": {"label": label, "name": "vit_tiny_patch16_224", "checkpoint": None},
        "scores": {"k=1": {"top1": score(value, interval), "top5": score(None)}},
        "config": {},
        "provenance": {},
        **extra,
    }


LAYOUT = ReportLayout(
    title="Toy",
    about=lambda document: [f"{len(document['models'])} models."],
    columns=(
        score_column("top1", "top-1"),
        delta_column("top1", "top-1"),
        score_column("top5", "top-5"),
        value_column("name", lambda record: record["model"]["name"]),
    ),
    notes=lambda document: ["## Notes", "", "the end", ""],
    setting_header="k",
)


def test_the_report_has_a_row_per_model_and_setting_and_the_protocols_columns():
    delta = PairedInterval(delta=2.0, low=-0.5, high=4.25, level=0.95, resamples=1000, seed=0)
    document = results_document(
        "locatdino toy", "knn", [_record("a", 45.0), _record("b", 47.0, differences={"k=1": {"top1": delta.to_dict()}})]
    )
    jsonschema.validate(document, RESULTS_SCHEMA)
    text = report_markdown(document, LAYOUT)
    lines = text.splitlines()
    assert lines[:5] == ["# Toy", "", "Command: `locatdino toy`", "", "2 models."]
    assert "| model | k | top-1 [95 %] | Δ top-1 [95 %] | top-5 [95 %] | name |" in lines
    assert "| a | k=1 | 45.00 [40.00, 50.00] | — | n/a | vit_tiny_patch16_224 |" in lines
    assert f"| b | k=1 | 47.00 [40.00, 50.00] | {delta.text()} | n/a | vit_tiny_patch16_224 |" in lines
    assert any(line.startswith("Δ = model − first model with its 95 % paired-bootstrap") for line in lines)
    assert lines[-3:] == ["## Notes", "", "the end"]
    single = report_markdown(results_document("locatdino toy", "knn", [_record("a", 45.0)]), LAYOUT)
    assert "paired-bootstrap" not in single  # no Δ to explain


def test_the_schema_and_the_reader_refuse_what_is_not_one_results_json(tmp_path):
    with pytest.raises(jsonschema.ValidationError, match="'scores' is a required property"):
        jsonschema.validate(
            results_document("c", "knn", [{"model": _record("a", 1)["model"], "config": {}}]), RESULTS_SCHEMA
        )
    bad_interval = _record("a", 45.0)
    bad_interval["scores"]["k=1"]["top1"]["interval"] = [40.0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(results_document("c", "knn", [bad_interval]), RESULTS_SCHEMA)
    earlier = {"miou": 40.0, "config": {}, "model": {"name": "m"}}  # one model per folder, as earlier versions wrote
    with pytest.raises(ValueError, match=r"^x.json: not a results.json of locatdino-evaluation/1; one written by an"):
        check_document(earlier, "x.json")
    with pytest.raises(ValueError, match=r"^x.json: results of `locatdino knn`, not of `locatdino hbird`$"):
        check_document(results_document("c", "knn", [_record("a", 1.0)]), "x.json", "hbird")
    with pytest.raises(ValueError, match=r"^x.json: no model record in it$"):
        check_document(results_document("c", "knn", []), "x.json")


class CountingProtocol(Protocol):
    """A sixth protocol in a few lines: the share of a model's weights above zero, per model."""

    command = "knn"  # the runner's names only: no such command is added
    description = "toy"
    out_default = "toy"
    artefact_files = ("weights.npy",)
    layout = LAYOUT

    def add_arguments(self, groups):
        add_data_arguments(groups.data, command="knn")
        groups.protocol.add_argument("--input-size", type=int, default=32)
        groups.protocol.add_argument("--seed", type=int, default=0)
        groups.runtime.add_argument("--device", default="cpu")

    def prepare(self, args):
        if args.input_size == 0:
            raise ValueError("--input-size 0: no image")
        return {"scored": []}

    def announce(self, run_, setup):
        return "counting"

    def score(self, model, run_, setup, device):
        weights = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
        setup["scored"].append(run_.label)
        above = 100 * float((weights > 0).mean())
        record = {"scores": {"k=1": {"top1": score(above, (above - 1, above + 1)), "top5": score(None)}}}
        record |= {"config": {}, "provenance": {}}
        return Scored(record, paired=above, artefacts={"weights.npy": lambda path: np.save(path, weights[:10])})

    def difference(self, scored, first, setup):
        delta = PairedInterval(scored.paired - first.paired, -1.0, 1.0, 0.95, 1000, 0)
        return {"k=1": {"top1": delta.to_dict()}}


def test_a_protocol_is_run_by_the_one_skeleton(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "a=vit_tiny_patch16_224", "--model", "b=locatvit_tiny_patch16_224", "--out", str(out)]
    assert run(CountingProtocol(), argv) == 0
    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    assert [m["model"]["label"] for m in document["models"]] == ["a", "b"] and "differences" not in document["models"][
        0
    ]
    assert document["command"] == "locatdino knn " + " ".join(argv)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("[!.]*") if p.is_file()) == [
        "a/weights.npy",
        "b/weights.npy",
        "report.md",
        "results.json",
    ]
    assert "| b | k=1 |" in capsys.readouterr().out and "| b | k=1 |" in (out / "report.md").read_text()
    # an earlier run's output is refused before any model is scored, and so is a bad setting
    protocol = CountingProtocol()
    with pytest.raises(SystemExit, match=r"holds the output of an earlier run \(results.json and 3 more\)"):
        run(protocol, argv)
    with pytest.raises(SystemExit, match=r"^locatdino knn: --input-size 0: no image$"):
        run(protocol, [*argv, "--input-size", "0"])


class ToleratingProtocol(CountingProtocol):
    """The toy with the runner's hooks that a comparison of many models uses (compare's): a model that
    fails is left out, a row without a model follows the models, a file across all rows is written
    last and the document holds a key of its own."""

    tolerated = (ValueError,)

    def score(self, model, run_, setup, device):
        if run_.label == "b":
            raise ValueError("no weight above zero\nand a second line")
        return super().score(model, run_, setup, device)

    def record(self, scored, args, run_, model):  # as compare: no dataset in the row's config
        return {**scored.record, "model": {"label": run_.label, "name": run_.name, "checkpoint": run_.checkpoint}}

    def rows_after(self, setup, first):
        row = {"model": {"label": "half", "name": "none", "checkpoint": None}, "config": {}, "provenance": {}}
        row["scores"] = {"k=1": {"top1": score(50.0, (49.0, 51.0)), "top5": score(None)}}
        return [Scored(row, paired=50.0)]

    def finish(self, setup, records, folder):
        records[0]["finished"] = True
        if folder is not None:
            folder.write_text("rows.txt", " ".join(record["model"]["label"] for record in records))

    def document_keys(self, setup):
        return {"scored": list(setup["scored"])}


def test_a_tolerant_protocol_leaves_out_a_failing_model_and_the_others_are_written(tmp_path, capsys):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    out = tmp_path / "out"
    models = ["a=vit_tiny_patch16_224", "b=vit_tiny_patch16_224", f"bad=vit_tiny_patch16_224:{broken}"]
    argv = [*(arg for model in [*models, "c=vit_tiny_patch16_224"] for arg in ("--model", model)), "--out", str(out)]
    assert run(ToleratingProtocol(), argv) == 1
    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    a, c, half = document["models"]
    assert [a["model"]["label"], c["model"]["label"], half["model"]["label"]] == ["a", "c", "half"]
    # bad is named as it is built, before any model is scored; b while it is scored; each in one line
    assert list(document["failed"]) == ["bad", "b"]
    assert document["failed"]["b"] == "vit_tiny_patch16_224:none: no weight above zero"
    assert document["failed"]["bad"].startswith(f"vit_tiny_patch16_224:{broken}: ")
    err = capsys.readouterr().err.splitlines()
    failures = [line for line in err if line.startswith("locatdino knn: model ")]
    assert failures == [f"locatdino knn: model {label!r} failed: {document['failed'][label]}" for label in ("bad", "b")]
    assert err.index(failures[0]) < err.index("[knn] a: counting") < err.index(failures[1])
    # the row without a model: after the models, its Δ to the first row as a model's (kept to 4 decimals)
    delta = 50.0 - a["scores"]["k=1"]["top1"]["value"]
    assert half["differences"]["k=1"]["top1"]["delta"] == pytest.approx(delta, abs=1e-4)
    assert c["differences"]["k=1"]["top1"]["delta"] == pytest.approx(0.0)  # the same seed, the same weights
    assert "dataset" not in a["config"] and "checkpoint" not in a["provenance"]  # the protocol's own record
    assert document["scored"] == ["a", "c"] and a["finished"] and "finished" not in c
    assert (out / "rows.txt").read_text() == "a c half"
    assert "| half | k=1 | 50.00 [49.00, 51.00] |" in (out / "report.md").read_text()
    assert "rows.txt" in OutputFolder(out, "knn").earlier()  # what finish() wrote is the run's


def test_a_model_that_fails_ends_the_run_of_a_protocol_that_tolerates_nothing(tmp_path):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    argv = ["--model", "a=vit_tiny_patch16_224", "--model", f"bad=vit_tiny_patch16_224:{broken}"]
    with pytest.raises(UserError, match=str(broken)):
        run(CountingProtocol(), [*argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # refused before any output
