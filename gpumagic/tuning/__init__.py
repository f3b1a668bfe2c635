"""Features built on reports for tuning sessions: comparing runs, measuring DataLoader settings,
and the runs remembered by label.

- :mod:`.comparison`: ``gpumagic.compare(before, after)`` → :class:`~.comparison.Comparison`;
- :mod:`.dataloader`: ``gpumagic.tune_dataloader(...)`` → :class:`~.dataloader.TuneResult`;
- :mod:`.runs`: labelled runs (``%%gpuprofile --label NAME``).

This layer reads reports and calls analysis; it never imports a renderer (its objects reach their
views through :mod:`gpumagic.report.views`) nor capture.
"""
