"""``locatdino fit``: the LightningCLI command (``cli``) and what keeps a long run safe — the checks
before any work (``fit_checks``, ``option_checks``, ``launch_checks``, ``config_files``,
``rank_agreement``), restarts and resumes (``restarts``), stop signals and timeouts
(``stop_checkpoint``, ``collective_timeout``) and atomic checkpoint files (``checkpoint_io``).

The top of :mod:`locatdino.ssl`: it imports the objectives, and none of them imports it.
"""
