"""What a ``fit`` run tells while and after it trains: the progress line in logs and pipes
(``progress``), the loss curves stitched over resumes (``curves``) and the experiment trackers
next to the CSV log (``trackers``). Imports no objective."""
