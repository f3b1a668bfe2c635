"""Renderers: they read a :class:`~gpumagic.report.model.Report` and never compute findings.

- :mod:`~gpumagic.render.text`: plain text at a fixed width (terminals, logs, ``text/plain``).
- :mod:`~gpumagic.render.html`: one self-contained HTML fragment or page (no script, no network).
- :mod:`~gpumagic.render.page`: the page kit every HTML view shares (scoped CSS, ``wrap``, ``document``).
- :mod:`~gpumagic.render._format`: format-neutral helpers (numbers, severities, a finding's windows as text).
- :mod:`~gpumagic.render.timeline`: the timeline figure (matplotlib OO API, Agg, no pyplot).
- :mod:`~gpumagic.render.breakdown`, :mod:`~gpumagic.render.charts`: step-time bars, memory curve.
- :mod:`~gpumagic.render.widget`: the live ipywidgets view (imports ipywidgets when built).

Importing this package imports nothing heavy; matplotlib and ipywidgets load when first used.
"""
