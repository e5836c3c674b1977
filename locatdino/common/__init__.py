"""What every command shares: option parsing and help layout (``arguments``, ``help_format``), the
one-line errors (``errors``), atomic output files and checked output folders (``output_files``,
``output_folder``), input file checks (``input_files``), thread caps (``threads``), progress lines
(``progress``) and stop signals of child processes (``processes``).

The lowest floor of the package: it imports nothing of locatdino above it, so any command, the
evaluation floor and the pretraining run may use it. Kept free of heavy imports: ``locatdino
--version`` and ``locatdino shards`` load it without Lightning.
"""
