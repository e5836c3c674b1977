"""Checks a command's ``results.json`` against the one schema of every evaluation command."""

import json
from pathlib import Path
from typing import Any

import jsonschema

from locatdino.evaluation.results import RESULTS_SCHEMA


def valid_results(path: str | Path, protocol: str) -> dict[str, Any]:
    """The document at ``path``, after jsonschema validated it and its protocol was checked."""
    document = json.loads(Path(path).read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    assert document["protocol"] == protocol and document["command"].startswith(f"locatdino {protocol}")
    return document
