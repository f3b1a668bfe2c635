"""The matplotlib figures of the run history and the DataLoader tuning follow a theme, as the
timeline does: every visible text keeps a contrast of at least 4.5:1 on the figure's background,
and series keep their hue (the dark theme's tint of it)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex

from gpumagic.render import palette
from gpumagic.tuning.history import History, StoredRun
from gpumagic.tuning.tuner import TuneConfig, TuneResult, TuneRow


def _tune() -> TuneResult:
    rows = [TuneRow(TuneConfig(w, False), batches=10, seconds=1.0, batches_per_s=b) for w, b in ((0, 10.0), (2, 18.0))]
    rows.append(TuneRow(TuneConfig(4, False), status="failed"))
    return TuneResult(rows=rows, batch_size=8)


def _history() -> History:
    runs = [StoredRun(id=i, label=f"run {i}", created_ns=(1_700_000_000 + i) * 10**9, source="test", workdir="/w",
                      notebook="", options={}, bundle="", device="GPU0", median_step_ms=12.5 - i, gpu_busy_frac=0.4 + i / 10,
                      top_finding="cpu-bound") for i in (1, 2, 3)]
    return History(runs=runs, where="memory")


def _texts(fig):
    for ax in fig.axes:
        yield from (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels())
        legend = ax.get_legend()
        if legend is not None:
            yield from legend.get_texts()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("make", [lambda t: _history().figure(theme=t), lambda t: _tune().figure(theme=t)],
                         ids=["history", "tune"])
def test_every_text_reads_on_the_theme_s_background(make, theme):
    fig = make(theme)
    th = palette.figure_theme(theme)
    assert to_hex(fig.get_facecolor()) == th.background
    shown = [t for t in _texts(fig) if t.get_visible() and t.get_text().strip()]
    assert shown
    for t in shown:
        assert palette.contrast(to_hex(t.get_color()), th.background) >= 4.5, (t.get_text(), t.get_color())
    for ax in fig.axes:
        assert to_hex(ax.get_facecolor()) == th.background


def test_the_dark_figures_keep_each_series_hue_as_its_tint():
    light, dark = _history().figure(), _history().figure(theme="dark")
    for a, b in zip(light.axes, dark.axes):
        for la, lb in zip(a.lines, b.lines):
            assert to_hex(lb.get_color()) == palette.DARK_TINT[to_hex(la.get_color()).upper()].lower()
    bars = [to_hex(p.get_facecolor()) for p in _tune().figure(theme="dark").axes[0].patches]
    assert palette.DARK_TINT[palette.ORANGE].lower() in bars and palette.DARK_TINT[palette.BLUE].lower() in bars


def test_an_unknown_theme_is_refused():
    with pytest.raises(ValueError, match="theme must be 'light' or 'dark'"):
        _tune().figure(theme="sepia")
    with pytest.raises(ValueError, match="theme must be 'light' or 'dark'"):
        _history().figure(theme="sepia")
