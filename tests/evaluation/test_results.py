"""The one output of every evaluation command (``results.json`` + ``report.md``) and the one runner."""

import json

import jsonschema
import numpy as np
import pytest

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
