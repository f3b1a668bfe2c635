"""The live widget's timeline with wheel and drag zoom: an anywidget around the inline SVG chart.

Why anywidget (https://anywidget.dev): it ships the front-end code as one plain ES module inside
the Python package, with no server extension and no build step, and the same module runs in
JupyterLab, Notebook 7, VS Code and Colab. The chart itself stays the kernel's
(:mod:`gpumagic.render.timeline_svg`): the module only moves it.

How a zoom goes:

1. **Instant, in the browser.** The wheel over the chart zooms around the cursor (a horizontal
   wheel or Shift+wheel pans), a drag pans, a double click shows the whole window. The bars and
   sampled curves are nested ``<svg>`` elements with a viewBox of :data:`VB_W` units across the
   drawn range, so the module only changes their viewBox: the drawn bars stretch and slide at
   once. The chart's title shows the range asked for, and the axis and step labels (still those
   of the drawn range) are dimmed until the new drawing arrives.
2. **Then, in the kernel.** After :data:`DEBOUNCE_MS` without a new wheel event (or when the drag
   ends) the module sets ``request`` ``[lo, hi, n]`` (ns after the window's start, a request
   counter); the Python side re-draws the chart for that range, with the aggregation of
   :mod:`gpumagic.render.timeline_svg` at the new scale (detail appears as you zoom in), and sends
   it as ``value``. The markup's wrapper carries the range it shows (``data-lo``, ``data-hi``)
   and the request it answers (``data-answered``), so a drawing that answers an older request is
   shown stretched to the newest one, and a drawing the kernel made on its own (a button, a
   dropdown, a finding's window) simply replaces the chart.

The class is built on first use (:func:`zoomable_timeline_class`): without anywidget the
widget falls back to the buttons (:mod:`gpumagic.render.widget`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpumagic.render.timeline_svg import VB_W

#: Quiet time after the last wheel event before the kernel is asked to re-draw, ms.
DEBOUNCE_MS = 180
#: Narrowest range the wheel zooms to, ns (the buttons' limit too).
MIN_SPAN_NS = 1000

ESM = """
const VB_W = @VB_W@;
const DEBOUNCE_MS = @DEBOUNCE_MS@;

function render({ model, el }) {
  el.classList.add("gm-zoom");
  const box = document.createElement("div");
  el.appendChild(box);
  let want = null;        // [lo, hi] asked for and not drawn yet (ns after the window's start)
  let timer = null;       // the pending request
  let sent = 0;           // the last request's number
  let drag = null;

  const wrapper = () => box.querySelector(".gm-zoom-chart");
  const chart = () => box.querySelector("svg.gm-tl");
  const drawn = () => { const w = wrapper(); return w ? [Number(w.dataset.lo), Number(w.dataset.hi)] : [0, 1]; };
  const full = () => model.get("full_span");
  const minSpan = () => model.get("min_span");

  function clamp(lo, hi) {
    const f = full();
    let span = Math.min(Math.max(hi - lo, minSpan()), f);
    lo = Math.min(Math.max(lo, 0), f - span);
    return [lo, lo + span];
  }

  function paint() {
    box.innerHTML = model.get("value");
    const w = wrapper();
    if (!w) return;
    for (const inner of w.querySelectorAll("svg.gm-tl svg[viewBox]")) inner.dataset.vb = inner.getAttribute("viewBox");
    const answered = Number(w.dataset.answered || 0);
    if (want && (timer !== null || answered < sent)) preview(want); else want = null;
  }

  function preview(range) {
    want = range;
    const [s, e] = drawn();
    const span = (e - s) || 1;
    const svg = chart();
    if (!svg) return;
    for (const inner of svg.querySelectorAll("svg[data-vb]")) {
      const vb = inner.dataset.vb.split(/[ ,]+/).map(Number);
      inner.setAttribute("viewBox", `${(range[0] - s) / span * VB_W} ${vb[1]} ${(range[1] - range[0]) / span * VB_W} ${vb[3]}`);
    }
    const moved = Math.abs(range[0] - s) > 0.5 || Math.abs(range[1] - e) > 0.5;
    svg.classList.toggle("gm-zooming", moved);
    const title = wrapper().querySelector(".gm-tl-title");
    if (title && moved) {
      const origin = Number(wrapper().dataset.origin);
      const ms = v => ((v - origin) / 1e6).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
      title.textContent = `Timeline \\u2014 ${ms(range[0])}\\u2013${ms(range[1])} ms (drawing\\u2026)`;
    }
  }

  function ask(range, now) {
    preview(range);
    if (timer !== null) clearTimeout(timer);
    const send = () => {
      timer = null;
      sent += 1;
      model.set("request", [want[0], want[1], sent]);
      model.save_changes();
    };
    if (now) send(); else timer = setTimeout(send, DEBOUNCE_MS);
  }

  function current() { return want || drawn(); }

  function frac(ev) {
    const r = chart().getBoundingClientRect();
    return [Math.min(Math.max((ev.clientX - r.left) / (r.width || 1), 0), 1), r.width || 1];
  }

  function onWheel(ev) {
    if (!ev.target.closest || !ev.target.closest("svg.gm-tl")) return;
    ev.preventDefault();
    const [lo, hi] = current();
    const span = hi - lo;
    const [x] = frac(ev);
    const unit = ev.deltaMode === 1 ? 33 : (ev.deltaMode === 2 ? 400 : 1);  // lines, pages, pixels
    const dx = ev.deltaX * unit, dy = ev.deltaY * unit;
    if (ev.shiftKey || Math.abs(dx) > Math.abs(dy)) {  // pan
      const d = (ev.shiftKey ? dy || dx : dx) / 600 * span;
      ask(clamp(lo + d, hi + d), false);
      return;
    }
    const factor = Math.exp(dy * 0.0025);
    const t = lo + x * span;
    const next = Math.min(Math.max(span * factor, minSpan()), full());
    ask(clamp(t - x * next, t - x * next + next), false);
  }

  function onDown(ev) {
    if (ev.button !== 0 || !ev.target.closest("svg.gm-tl")) return;
    drag = { x0: ev.clientX, width: frac(ev)[1], range: current(), moved: false, id: ev.pointerId };
  }

  function onMove(ev) {
    if (!drag || ev.pointerId !== drag.id) return;
    const dx = ev.clientX - drag.x0;
    if (!drag.moved && Math.abs(dx) < 3) return;
    if (!drag.moved) {
      drag.moved = true;
      try { el.setPointerCapture(ev.pointerId); } catch (_) { /* pointer gone */ }
      el.classList.add("gm-dragging");
    }
    ev.preventDefault();
    const [lo, hi] = drag.range;
    const d = -dx / drag.width * (hi - lo);
    preview(clamp(lo + d, hi + d));
  }

  function onUp(ev) {
    if (!drag || ev.pointerId !== drag.id) return;
    const moved = drag.moved;
    drag = null;
    el.classList.remove("gm-dragging");
    if (moved && want) ask(want, true);
  }

  function onDouble(ev) {
    if (!ev.target.closest("svg.gm-tl")) return;
    ask([0, full()], true);
  }

  model.on("change:value", paint);
  el.addEventListener("wheel", onWheel, { passive: false });
  el.addEventListener("pointerdown", onDown);
  el.addEventListener("pointermove", onMove);
  el.addEventListener("pointerup", onUp);
  el.addEventListener("pointercancel", onUp);
  el.addEventListener("dblclick", onDouble);
  paint();
  return () => {
    if (timer !== null) clearTimeout(timer);
    model.off("change:value", paint);
  };
}

export default { render };
""".replace("@VB_W@", str(VB_W)).replace("@DEBOUNCE_MS@", str(DEBOUNCE_MS))

#: Styles of the module's element (the chart's own come with the page's CSS).
CSS = (
    ".gm-zoom svg.gm-tl{cursor:grab;touch-action:pan-y;user-select:none}"
    ".gm-zoom.gm-dragging svg.gm-tl{cursor:grabbing}"
    ".gm-zoom svg.gm-tl.gm-zooming .gm-tl-ticklabel,.gm-zoom svg.gm-tl.gm-zooming .gm-tl-steplabel,"
    ".gm-zoom svg.gm-tl.gm-zooming .gm-tl-tick{opacity:.3}"
)


@lru_cache(maxsize=1)
def zoomable_timeline_class() -> Any:
    """The anywidget class of the zoomable timeline, or ``None`` when anywidget is not installed."""
    try:
        import anywidget
        import traitlets
    except ImportError:
        return None

    class ZoomableTimeline(anywidget.AnyWidget):
        """The chart's markup (``value``, see :func:`chart_markup`), the whole window's length
        (``full_span``, ns), the narrowest range (``min_span``) and the front end's last
        ``request`` ``[lo, hi, n]``."""

        _esm = ESM
        _css = CSS
        value = traitlets.Unicode("").tag(sync=True)
        full_span = traitlets.Float(1.0).tag(sync=True)
        min_span = traitlets.Float(float(MIN_SPAN_NS)).tag(sync=True)
        request = traitlets.List(traitlets.Float(), default_value=[]).tag(sync=True)

    return ZoomableTimeline


def chart_markup(html: str, *, lo: float, hi: float, origin: float, answered: int) -> str:
    """``html`` (the chart, its title and key) in the wrapper the module reads: the range it
    shows (``lo``, ``hi``) and where the axis puts 0 (``origin``), in ns after the window's start,
    and the number of the request it answers."""
    return (f'<div class="gm-zoom-chart" data-lo="{lo:.0f}" data-hi="{hi:.0f}" data-origin="{origin:.0f}" '
            f'data-answered="{answered}">{html}</div>')
