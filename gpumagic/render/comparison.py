"""Text and HTML for a :class:`~gpumagic.tuning.comparison.Comparison` (its ``data`` dict): a table of
step time and the headline metrics before / after, the per-step breakdown, and the findings
resolved, new and persisting.

One speed-up notation everywhere: ``'1.40× faster'`` (the median step before ÷ after) or
``'1.16× slower'`` (after ÷ before), as the verdict says it, with as many decimals as the 95 %
interval of the speed-up supports (``'1.4× faster (1.2–1.6×)'``). A change is marked better or
worse by a word as well as a colour; a slower run has its own banner ("Slow-down", red), and a
difference in conditions that can explain the change leads the view."""

from __future__ import annotations

from html import escape
from typing import Any

from gpumagic.render._format import MISSING, fmt_bytes, fmt_ms, fmt_pct
from gpumagic.render.page import document, wrap
from gpumagic.render.palette import CATEGORY_LABEL
from gpumagic.render.terminal import printable, printable_lines
from gpumagic.tuning import stats
from gpumagic.tuning.comparison import SAME_STEP_TOLERANCE, difference

# -- text -----------------------------------------------------------------------------------------

#: Widths of the text table: the row name, then before / after (widened to fit the labels, up
#: to MAX_VALUE_W) / change.
NAME_W, VALUE_W, MAX_VALUE_W, CHANGE_W = 30, 14, 32, 22
MINUS = "\u2212"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return MISSING
    if unit == "ms":
        return fmt_ms(value)
    if unit == "frac":
        return fmt_pct(value, 1)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:,.1f}" if value % 1 else f"{value:,.0f}"


def _fmt_change(before: float | None, after: float | None, unit: str) -> str:
    """``'+16.0 pts'``, ``'−38.3 ms'``: the signed change, in the row's unit."""
    delta = difference(after, before)
    if delta is None:
        return MISSING
    sign = "+" if delta > 0 else MINUS if delta < 0 else "±"
    if unit == "frac":
        return f"{sign}{abs(delta) * 100:.1f} pts"
    return sign + _fmt(abs(delta), unit)


def fmt_speed(ratio: float | None, ci: list[float] | None = None) -> str:
    """The step-time ratio (after / before) as a speed-up: ``'1.40× faster'``, ``'1.16× slower'``;
    with the speed-up's interval ``ci``, to the decimals it supports."""
    if ratio is None or ratio <= 0:
        return MISSING
    speedup = stats.speedup_of(ratio)
    d = stats.speedup_decimals(speedup, None if ci is None else (ci[0], ci[1]))
    if round(ratio, d) == 1:
        return f"{1:.{d}f}\u00d7 (same speed)"
    return f"{speedup:.{d}f}\u00d7 faster" if ratio < 1 else f"{ratio:.{d}f}\u00d7 slower"


def headline(data: dict[str, Any]) -> tuple[str, str, str]:
    """(banner label, speed text, css direction) of the comparison: "Speed-up" / "1.4× faster
    (1.2–1.6×)" / "better", "Slow-down" / "1.40× slower (…)" / "worse", or "No clear change"."""
    ratio, ci = data["step_time_ratio"], data.get("speedup_ci")
    if ratio is None:
        return "Speed", MISSING, ""
    shown = stats.fmt_speedup(stats.speedup_of(ratio), None if ci is None else (ci[0], ci[1]))
    change = data.get("change")
    if change == stats.FASTER:
        return "Speed-up", shown, "better"
    if change == stats.SLOWER:
        return "Slow-down", shown, "worse"
    if ci is None:
        return "No clear change", fmt_speed(ratio) + " by the median step (too few steps to tell)", ""
    return "No clear change", shown.removeprefix("no clear change (").rstrip(")"), ""


#: What the speed-up figures mean, said once under the comparison's tiles.
SPEED_NOTE = ("N× faster: the median step before divided by the median step after; N× slower: after divided by "
              "before; in brackets, its 95 % interval (bootstrap over the recorded steps). \"No clear change\" when "
              "the interval includes no change. Changes are signed (− shorter, + longer) and marked better or worse "
              "in words.")


def _step_change(data: dict[str, Any]) -> str:
    ratio = data["step_time_ratio"]
    if ratio is None:
        return MISSING
    pct = (ratio - 1) * 100
    return f"{'+' if pct > 0 else MINUS if pct < 0 else '±'}{abs(pct):.0f} % ({fmt_speed(ratio, data.get('speedup_ci'))})"


def table_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(name, before, after, change, css class of the change) for the headline table."""
    b, a = data["before"], data["after"]
    rows = [("median step", _fmt(b["step_median_ms"], "ms"), _fmt(a["step_median_ms"], "ms"), _step_change(data),
             _direction(b["step_median_ms"], a["step_median_ms"], "lower")),
            *(_ms_row(name, b[key], a[key]) for name, key in (("mean step", "step_mean_ms"), ("p90 step", "step_p90_ms"))),
            ("GPU busy", _fmt(data["gpu_busy"]["before"], "frac"), _fmt(data["gpu_busy"]["after"], "frac"),
             _fmt_change(data["gpu_busy"]["before"], data["gpu_busy"]["after"], "frac"),
             _direction(data["gpu_busy"]["before"], data["gpu_busy"]["after"], "higher"))]
    for m in data["metrics"]:
        rows.append((m["name"], _fmt(m["before"], m["unit"]), _fmt(m["after"], m["unit"]),
                     _fmt_change(m["before"], m["after"], m["unit"]), _direction(m["before"], m["after"], m["better"])))
    return rows


def _ms_row(name: str, before: float | None, after: float | None) -> tuple[str, str, str, str, str]:
    return name, _fmt(before, "ms"), _fmt(after, "ms"), _fmt_change(before, after, "ms"), _direction(before, after, "lower")


def breakdown_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """One row per category that took time in either run; a change is marked better or worse
    only when it exceeds the "about the same" share of the median step before."""
    step = data["before"]["step_median_ms"]
    floor = (data["same_tolerance_frac"] or SAME_STEP_TOLERANCE) * step if step else None
    rows = []
    for r in data["breakdown"]["categories"]:
        if not (r["before_ms"] or r["after_ms"]):
            continue
        delta = difference(r["after_ms"], r["before_ms"])
        marked = floor is not None and delta is not None and abs(delta) > floor
        rows.append((CATEGORY_LABEL.get(r["category"], r["category"]), _fmt(r["before_ms"], "ms"), _fmt(r["after_ms"], "ms"),
                     _fmt_change(r["before_ms"], r["after_ms"], "ms"),
                     _direction(r["before_ms"], r["after_ms"], "lower") if marked else ""))
    return rows


def _direction(before: float | None, after: float | None, better: str) -> str:
    """``'better'``, ``'worse'`` or ``''`` for a change, given which way is better."""
    delta = difference(after, before)
    if not better or not delta:
        return ""
    return "better" if (delta < 0) == (better == "lower") else "worse"


def finding_lines(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(group, one line per finding) for resolved, new and persisting findings."""
    out = []
    for group in ("resolved", "new", "persisting"):
        for fid in data[group]:
            d = data["findings"][fid]
            if group == "resolved":
                gain = f"est. gain was {_gain(d['before'])}"
            elif group == "new":
                gain = f"est. gain {_gain(d['after'])}"
            else:
                gain = f"est. gain {_gain(d['before'])} → {_gain(d['after'])}"
            out.append((group, f"{fid}: {d['title']} ({gain})"))
    return out


def _gain(side: dict[str, Any]) -> str:
    """A finding's estimated gain (an upper bound on the step time it could save) as ``'33 %'``."""
    gain = side["est_gain"]
    return "<1 %" if gain < 0.005 else f"{gain * 100:.0f} %"


def _clip(s: str, w: int) -> str:
    return s if len(s) <= w else s[: w - 1] + "…"


def _text_table(title: str, data: dict[str, Any], rows: list[tuple[str, ...]]) -> list[str]:
    la, lb = data["before"]["label"], data["after"]["label"]
    w = min(MAX_VALUE_W, max(VALUE_W, len(la) + 2, len(lb) + 2))
    head = f"{_clip(title, NAME_W):<{NAME_W}}{_clip(la, w - 2):>{w}}{_clip(lb, w - 2):>{w}}  {'change':>{CHANGE_W}}"
    lines = [head, "-" * len(head)]
    lines += [f"{_clip(n, NAME_W):<{NAME_W}}{x:>{w}}{y:>{w}}  {c:>{CHANGE_W}}" for n, x, y, c, _ in rows]
    return lines


def render_text(data: dict[str, Any]) -> str:
    """The comparison as plain text (about 75 columns); labels, titles and notes pass through
    :func:`~gpumagic.render.terminal.printable`, the whole through ``printable_lines``."""
    data = {**data, "before": {**data["before"], "label": printable(data["before"]["label"])},
            "after": {**data["after"], "label": printable(data["after"]["label"])}}
    lines = [f"gpumagic comparison: {data['before']['label']} → {data['after']['label']}"]
    if data.get("caution"):
        lines.append("CAUTION: " + printable(data["caution"]))
    lines += [printable(data["verdict"]), ""]
    if data.get("conditions"):
        lines += ["What else differed between the runs"] + [f"  - {printable(c)}" for c in data["conditions"]] + [""]
    lines += [*_text_table("", data, table_rows(data)), ""]
    lines += [*_text_table(f"Breakdown ({data['breakdown']['unit']})", data, breakdown_rows(data)), "", "Findings"]
    found = finding_lines(data)
    for group in ("resolved", "new", "persisting"):
        items = [printable(line) for g, line in found if g == group]
        lines += [f"  {group:<11} {items[0] if items else 'none'}"] + [f"  {'':<11} {x}" for x in items[1:]]
    if data["notes"]:
        lines += ["", "Notes"] + [f"  - {printable(n)}" for n in data["notes"]]
    return printable_lines("\n".join(lines) + "\n")


# -- HTML -----------------------------------------------------------------------------------------

#: Words beside a marked change, so that better / worse never rests on colour alone.
DIRECTION_WORD = {"better": "\u25b2 better", "worse": "\u25bc worse"}


def _html_table(title: str, data: dict[str, Any], rows: list[tuple[str, ...]]) -> str:
    """Name, then the change (what a reader looks for, so that a narrow output never scrolls it
    out of view), then the two runs' values."""
    head = (f"<tr><th>{escape(title)}</th><th>change</th><th>{escape(data['before']['label'])}</th>"
            f"<th>{escape(data['after']['label'])}</th></tr>")
    body = "".join(
        f'<tr><td>{escape(n)}</td><td class="gm-num{" gm-" + css if css else ""}">{escape(c)}'
        f'{" · " + DIRECTION_WORD[css] if css in DIRECTION_WORD else ""}</td>'
        f'<td class="gm-num">{escape(x)}</td><td class="gm-num">{escape(y)}</td></tr>'
        for n, x, y, c, css in rows)
    return f'<div class="gm-scroll"><table class="gm-table"><thead>{head}</thead><tbody>{body}</tbody></table></div>'


def _tiles_html(data: dict[str, Any]) -> str:
    b, a = data["before"], data["after"]
    busy_b, busy_a = data["gpu_busy"]["before"], data["gpu_busy"]["after"]
    label, shown, _ = headline(data)
    tiles = [(label, shown),
             ("Median step", f"{_fmt(b['step_median_ms'], 'ms')} \u2192 {_fmt(a['step_median_ms'], 'ms')}"),
             ("GPU busy", f"{_fmt(busy_b, 'frac')} \u2192 {_fmt(busy_a, 'frac')}" if busy_b is not None or busy_a is not None else MISSING),
             ("Findings resolved / new / persisting", f"{len(data['resolved'])} / {len(data['new'])} / {len(data['persisting'])}")]
    return '<div class="gm-facts">' + "".join(
        f'<div class="gm-fact"><div class="gm-fact-label">{escape(k)}</div><div class="gm-fact-value">{escape(v)}</div></div>'
        for k, v in tiles if v != MISSING) + "</div>"


def _findings_html(data: dict[str, Any]) -> str:
    found = finding_lines(data)
    rows = []
    for group in ("resolved", "new", "persisting"):
        items = [printable(line) for g, line in found if g == group] or ["none"]
        cell = "<br>".join(escape(x) for x in items)
        rows.append(f'<tr><td class="gm-group">{group}</td><td>{cell}</td></tr>')
    return f'<div class="gm-scroll"><table class="gm-table"><tbody>{"".join(rows)}</tbody></table></div>'


def render_fragment(data: dict[str, Any], full_report_html: str = "") -> str:
    """The comparison as one scoped ``<div>`` (the notebook's ``text/html``): the answer first
    (speed-up, step time before → after, findings resolved / new / persisting), then the tables;
    ``full_report_html``, when given, follows collapsed in a ``<details>``."""
    notes = "".join(f"<li>{escape(n)}</li>" for n in data["notes"])
    after = escape(data["after"]["label"])
    full = (f'<details class="gm-full"><summary>Full report of \u201c{after}\u201d</summary>{full_report_html}</details>'
            if full_report_html else "")
    _, _, direction = headline(data)
    colour = {"better": "var(--gm-good)", "worse": "var(--gm-bad)"}.get(direction)
    style = f' style="border-left-color:{colour}"' if colour else ""
    word = f'<strong class="gm-{direction}">{escape(DIRECTION_WORD[direction])}</strong> ' if direction else ""
    caution = (f'<div class="gm-top" style="border-left-color:var(--gm-bad)"><strong>Caution:</strong> '
               f'{escape(data["caution"])}</div>' if data.get("caution") else "")
    conditions = "".join(f"<li>{escape(c)}</li>" for c in data.get("conditions") or [])
    inner = (
        f"<h2>{escape(data['before']['label'])} \u2192 {after}</h2>"
        f"{caution}{_tiles_html(data)}<div class=\"gm-top gm-verdict\"{style}>{word}{escape(data['verdict'])}</div>"
        + (f"<h3>What else differed between the runs</h3><ul>{conditions}</ul>" if conditions else "") +
        f'<p class="gm-muted">{escape(SPEED_NOTE)}</p>'
        f"<h3>Findings</h3>{_findings_html(data)}"
        f"<h3>Step time and GPU</h3>{_html_table('', data, table_rows(data))}"
        f"<h3>Breakdown ({escape(data['breakdown']['unit'])})</h3>{_html_table('', data, breakdown_rows(data))}"
        + (f"<h3>Notes</h3><ul>{notes}</ul>" if notes else "")
        + full
    )
    return wrap(inner, static=True)


def html_document(data: dict[str, Any]) -> str:
    """A complete self-contained HTML page."""
    return document(f"gpumagic comparison: {data['before']['label']} \u2192 {data['after']['label']}", render_fragment(data))
