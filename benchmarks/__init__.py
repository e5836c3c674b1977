"""Speed benchmarks, learning studies and the GPU check of locatdino (see ``benchmarks/README.md``).

A package so that every script runs as ``python -m benchmarks.<folder>.<name>`` from the
repository root and imports its neighbours (and the tests import it) without path edits."""
