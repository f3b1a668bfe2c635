"""Features built on reports for tuning sessions: comparing runs, measuring DataLoader settings,
and the run history.

- :mod:`.comparison`: ``gpumagic.compare(before, after)`` → :class:`~.comparison.Comparison`;
- :mod:`.tuner`: :class:`~.tuner.TuneResult`, what ``gpumagic.tune_dataloader(...)`` returns (the
  measurement itself runs the user's loader, so it lives in :mod:`gpumagic.capture.dataloader`);
- :mod:`.history`: the run history, an SQLite database that outlives the kernel, and
  ``gpumagic.history()``'s :class:`~.history.History`;
- :mod:`.runs`: runs by name on top of it (``LABEL``, ``LABEL@N``, ``r<id>``) for ``--label`` and ``--compare``.

This layer reads reports and calls analysis; it never imports a renderer (its objects reach their
views through :mod:`gpumagic.report.views`) nor capture.
"""
