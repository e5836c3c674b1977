"""``locatdino compare``: several frozen models on one dataset, one report with figures.

Built on the two evaluation protocols, never the other way: Hummingbird
(:mod:`locatdino.evaluation.hbird`) and the probes (:mod:`locatdino.evaluation`), both on the shared
evaluation floor (:mod:`locatdino.evaluation`). ``runner`` measures a model,
``cli`` is the protocol the evaluation runner (:mod:`locatdino.evaluation.runner`) parses, scores and
writes with, ``report`` lays out ``report.md``, ``figures`` draws; the pictures'
inputs come from ``attention_maps``, ``pca_maps`` and ``forward_cost``.
"""
