"""Text and HTML for a :class:`~gpumagic.jobs.model.Job`: a row per rank, the stragglers, the
job's findings, and in HTML a per-rank chart of step time (inline SVG, no script, no network).
The JSON view is :meth:`Job.to_dict <gpumagic.jobs.model.Job.to_dict>` itself."""

from __future__ import annotations

import textwrap
from html import escape
from typing import TYPE_CHECKING

from gpumagic.render._format import MISSING, fmt_gain, fmt_ms, fmt_pct, severity_label
from gpumagic.render.html import finding_body_html
from gpumagic.render.page import document, wrap
from gpumagic.render.palette import BLUE, PALE_GREY, PURPLE, VERMILLION
from gpumagic.render.terminal import printable, printable_lines

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.jobs.findings import JobFinding
    from gpumagic.jobs.model import Job
    from gpumagic.jobs.summary import RankSummary

COLUMNS = ("rank", "device", "step med", "step p90", "GPU busy", "comm", "exposed", "top finding")
#: The device column's width: GPU names as CUDA reports them ("NVIDIA A100-SXM4-80GB") fit.
DEVICE_W = 22
#: Above this many ranks the chart draws thin rows and labels only the stragglers and failures.
LABELLED_RANKS = 64


def title(job: Job) -> str:
    n, total = len(job.analysed), len(job.ranks)
    ranks = f"{total} ranks" if n == total else f"{n} of {total} ranks analysed"
    label = f"{printable(job.label)}: " if job.label else ""
    return f"gpumagic job: {label}{ranks} (world size {job.world_size}), median step {fmt_ms(job.step_median_ms)}"


def straggler_line(job: Job) -> str:
    if job.same_recording:
        return "Stragglers: cannot tell \u2014 every rank file holds the same recording"
    if not job.stragglers:
        return "Stragglers: none"
    f = job.finding("straggler-rank")
    lost = f.finding.evidence.numbers.get("lost_ms_per_step") if f else None
    ranks = ", ".join(map(str, job.stragglers))
    share = f" ({fmt_pct(f.finding.est_gain)} of the median step)" if f else ""
    return f"Stragglers: rank{'s' if len(job.stragglers) > 1 else ''} {ranks} \u2014 the job loses {fmt_ms(lost)} per step{share}"


def _rank_label(r: RankSummary, stragglers: list[int]) -> str:
    return ("?" if r.rank is None else str(r.rank)) + ("*" if r.rank in stragglers else "")


def rank_row(r: RankSummary, stragglers: list[int]) -> tuple[str, ...]:
    if not r.ok:
        return (_rank_label(r, stragglers), "failed", MISSING, MISSING, MISSING, MISSING, MISSING, MISSING)
    return (_rank_label(r, stragglers), printable(r.device) or MISSING, fmt_ms(r.step_median_ms), fmt_ms(r.step_p90_ms),
            fmt_pct(r.gpu_busy_frac), fmt_ms(r.comm_ms), fmt_ms(r.comm_exposed_ms), r.top_finding or "none")


def _clip(s: str, w: int) -> str:
    return s if len(s) <= w else s[: w - 1] + "\u2026"


def _table(job: Job, width: int) -> list[str]:
    rows = [rank_row(r, job.stragglers) for r in job.ranks]
    fixed = [5, max(8, min(DEVICE_W, max(len(r[1]) for r in rows))), 8, 8, 8, 8, 8]
    last_w = max(len("low-gpu-utilization"), width - sum(fixed) - len(fixed) * 2)
    fmt = [">", "<", ">", ">", ">", ">", ">"]

    def line(cells):
        body = "  ".join(f"{_clip(c, w):{a}{w}}" for c, w, a in zip(cells, fixed, fmt))
        return f"{body}  {_clip(cells[-1], last_w)}".rstrip()

    return [line(COLUMNS), *map(line, rows)]


def _finding_text(jf: JobFinding, analysed: int, width: int) -> list[str]:
    f = jf.finding
    where = ("" if jf.scope == "job"
             else f" \u2014 on {len(jf.ranks)} of {analysed} ranks (evidence: rank {jf.evidence_rank})")
    lines = textwrap.wrap(f"{severity_label(f.severity)}  {f.title}{where} \u2014 {fmt_gain(f.est_gain, f.gain_method)}", width,
                          initial_indent="  ", subsequent_indent="      ")
    lines += textwrap.wrap(f.evidence.summary, width, initial_indent="      ", subsequent_indent="      ")
    for fix in sorted(f.fixes, key=lambda x: x.diagnostic)[:1]:  # the first change, else the first diagnostic
        kind = "Diagnostic" if fix.diagnostic else "Fix"
        lines += textwrap.wrap(f"{kind}: {fix.description}", width, initial_indent="      ", subsequent_indent="           ")
        lines += [f"        {x}" for x in fix.code.splitlines()]
    return lines


#: Collectives listed in the text render (the HTML and JSON list all of ``Job.collectives``).
TEXT_COLLECTIVES = 5


def _collectives_text(job: Job, width: int) -> list[str]:
    """Per collective: count, the last rank, and each rank's duration, wait and arrival skew."""
    if not job.collectives:
        return []
    lines = ["", *textwrap.wrap("COLLECTIVES ACROSS RANKS (medians; wait: time inside it waiting for the last rank; "
                                "skew: arrival after the first rank)", width)]
    for c in job.collectives[:TEXT_COLLECTIVES]:
        lines.append(f"  {_clip(c['name'], max(30, width - 40))}  \u00d7{c['count']}  "
                     f"last: rank {c['last_rank']} ({100 * c['last_share']:.0f} %)")
        if _message(c):
            lines.append(f"    {_message(c)}")
        lines.append(f"    {'rank':>6} {'duration':>10} {'wait':>10} {'skew':>10} {'last':>6} {'bus GB/s':>9}")
        lines += [f"    {r['rank']:>6} {r['dur_ms']:>8.3f}ms {r['wait_ms']:>8.3f}ms {r['skew_ms']:>8.3f}ms {r['last_count']:>6}"
                  f" {_gbps(r.get('bus_gbps')):>9}" for r in c["ranks"]]
    return lines


def _message(c: dict) -> str:
    """``all_reduce, 1.47 MB, group of 8``: what the trace records about a collective's message."""
    parts = [_clip(printable(c["collective"]), 60)] if c.get("collective") else []  # may be a name from the file
    if c.get("size_bytes") is not None:
        parts.append(_bytes(c["size_bytes"]))
    if c.get("group_size"):
        parts.append(f"group of {c['group_size']}")
    return ", ".join(parts)


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _gbps(v: float | None) -> str:
    return "\u2013" if v is None else f"{v:.1f}"


def _collectives_html(job: Job) -> str:
    if not job.collectives:
        return ""
    out = ['<h3>Collectives across ranks</h3><p class="gm-muted">Medians over the instances of each collective, matched '
           "by step and position. Wait: time inside the collective waiting for the last rank; skew: how long after the "
           "first rank this one arrived. Bus bandwidth: nccl-tests' busbw (message size over the rank's kernel "
           "time, waiting included, times 2(n\u22121)/n for all-reduce, (n\u22121)/n for all-gather, reduce-scatter "
           "and all-to-all); \u2013 where the trace records no message size or group size.</p>"]
    late = ' class="gm-straggler"'
    for c in job.collectives:
        rows = "".join(
            f'<tr{late if r["rank"] == c["last_rank"] else ""}><td class="gm-num">{r["rank"]}</td>'
            f'<td class="gm-num">{r["dur_ms"]:.3f} ms</td><td class="gm-num">{r["wait_ms"]:.3f} ms</td>'
            f'<td class="gm-num">{r["skew_ms"]:.3f} ms</td><td class="gm-num">{r["last_count"]}</td>'
            f'<td class="gm-num">{_gbps(r.get("bus_gbps"))}</td></tr>'
            for r in c["ranks"])
        msg = f" ({escape(_message(c))})" if _message(c) else ""
        out.append(f'<p><code>{escape(c["name"][:120])}</code>{msg} \u00d7{c["count"]} \u2014 last to arrive: rank '
                   f'{c["last_rank"]} ({100 * c["last_share"]:.0f} %)</p>'
                   '<div class="gm-scroll"><table class="gm-table"><thead><tr><th>rank</th><th>duration</th><th>wait</th>'
                   f"<th>skew</th><th>arrived last</th><th>bus GB/s</th></tr></thead><tbody>{rows}</tbody></table></div>")
    return "".join(out)


def render_text(job: Job, width: int | None = None) -> str:
    """The job as plain text, ``width`` columns wide (``None``: the terminal's, as the report's text)."""
    from gpumagic.render._width import resolve_width

    width = resolve_width(width)
    lines = [title(job), straggler_line(job), "", *_table(job, width)]
    if job.stragglers:
        lines.append("  (* straggler)")
    if job.errors:
        lines += ["", "Ranks that could not be analysed"]
        lines += [f"  rank {'?' if r.rank is None else r.rank}: {printable(r.error)}" for r in job.errors]
    job_level = [f for f in job.findings if f.scope == "job"]
    common = [f for f in job.findings if f.scope == "common"]
    n = len(job.analysed)
    if job_level:
        lines += ["", "Job findings"] + [x for f in job_level for x in _finding_text(f, n, width)]
    lines += ["", "Findings on at least half of the ranks (listed once)"]
    lines += [x for f in common for x in _finding_text(f, n, width)] or ["  none"]
    if job.other_findings:
        lines += ["", "Findings on fewer ranks"]
        lines += [f"  {d['id']}: rank{'s' if len(d['ranks']) != 1 else ''} {', '.join(map(str, d['ranks']))}"
                  for d in job.other_findings]
    lines += _collectives_text(job, width)
    if job.notes:
        lines += ["", "Notes"] + [x for n in map(printable, job.notes)
                                  for x in textwrap.wrap(n, width, initial_indent="  - ", subsequent_indent="    ")]
    lines += ["", "Details of one rank: gpumagic analyze <its trace file>"]
    # rank file names, device names and labels come from files and users: no escape code reaches a terminal
    return printable_lines("\n".join(lines)) + "\n"


# -- HTML -----------------------------------------------------------------------------------------

#: The chart's text in the theme's colour; the ranks' table stacked (one card per rank, each cell
#: labelled with its column) in an output narrower than 640 px, so the page never scrolls sideways.
EXTRA_CSS = (".gpumagic-report .gm-straggler td{background:var(--gm-top)}"
             ".gpumagic-report .gm-rank-chart{max-width:900px;font-size:12px;color:var(--gm-fg)}"
             ".gpumagic-report .gm-rank-row{display:flex;align-items:center;gap:8px;min-height:14px}"
             ".gpumagic-report .gm-rank-label{flex:0 0 64px;text-align:right;white-space:nowrap}"
             ".gpumagic-report svg.gm-rank-bar{flex:1 1 auto;min-width:0;height:10px}"
             ".gpumagic-report .gm-rank-value{flex:0 0 auto;min-width:64px;font-variant-numeric:tabular-nums}"
             ".gpumagic-report .gm-jobtable{container-type:inline-size}"
             "@container (max-width:640px){.gpumagic-report table.gm-stack thead{display:none}"
             ".gpumagic-report table.gm-stack,.gpumagic-report table.gm-stack tbody,.gpumagic-report table.gm-stack tr,"
             ".gpumagic-report table.gm-stack td{display:block;width:100%}"
             ".gpumagic-report table.gm-stack tr{margin:0 0 8px;border:1px solid var(--gm-border);border-radius:6px}"
             ".gpumagic-report table.gm-stack td{border:0;text-align:left !important;white-space:normal !important}"
             ".gpumagic-report table.gm-stack td::before{content:attr(data-label) \": \";font-weight:600;"
             "color:var(--gm-muted)}}")


def rank_chart_svg(job: Job) -> str:
    """One horizontal bar per rank: the median step, its exposed communication in purple (and
    hatched: told apart without colour); a straggler's bar in vermillion and named "straggler";
    a failed rank as a grey stub. HTML rows (label, bar, value), so the text keeps its size at any
    width and its colour follows the theme; each bar is a small SVG stretched to its cell."""
    ranks = job.ranks
    longest = max((r.step_median_ms or 0.0 for r in ranks), default=0.0) or 1.0
    labelled = len(ranks) <= LABELLED_RANKS
    rows = []
    for r in ranks:
        straggler = r.rank in job.stragglers
        name = f"rank {'?' if r.rank is None else r.rank}"
        label = name if labelled or straggler or not r.ok else ""
        label_html = f'<span class="gm-rank-label">{escape(label)}</span>'
        if not r.ok:
            error = escape(printable(r.error or ""), quote=True)
            rows.append(f'<div class="gm-rank-row" title="{name}: {error}">{label_html}<svg class="gm-rank-bar" '
                        f'preserveAspectRatio="none" viewBox="0 0 1000 10"><rect x="0" y="0" width="8" height="10" '
                        f'fill="{PALE_GREY}"/></svg><span class="gm-rank-value">failed</span></div>')
            continue
        w = 1000 * (r.step_median_ms or 0.0) / longest
        comm = min(w, 1000 * (r.comm_exposed_ms or 0.0) / max(len(r.steps), 1) / longest) if r.steps else 0.0
        tip = escape(f"{name}: median step {fmt_ms(r.step_median_ms)}, exposed communication "
                     f"{fmt_ms(r.comm_exposed_ms)} in the window" + (" (straggler)" if straggler else ""), quote=True)
        value = fmt_ms(r.step_median_ms) + (" \u00b7 straggler" if straggler else "") if labelled or straggler else ""
        rows.append(f'<div class="gm-rank-row{" gm-rank-straggler" if straggler else ""}" title="{tip}">{label_html}'
                    f'<svg class="gm-rank-bar" preserveAspectRatio="none" viewBox="0 0 1000 10">'
                    f'<rect x="0" y="0" width="{w - comm:.1f}" height="10" fill="{VERMILLION if straggler else BLUE}"/>'
                    f'<rect x="{w - comm:.1f}" y="0" width="{comm:.1f}" height="10" fill="{PURPLE}"/>'
                    f'<rect x="{w - comm:.1f}" y="0" width="{comm:.1f}" height="10" fill="url(#gm-rank-hatch)"/></svg>'
                    f'<span class="gm-rank-value">{escape(value)}</span></div>')
    key = "".join(f'<li><span class="gm-swatch" style="background:{c}"></span>{escape(t)}</li>'
                  for c, t in ((BLUE, "step (median)"), (PURPLE, "exposed communication per step (hatched)"),
                               (VERMILLION, "straggler")))
    hatch = ('<svg width="0" height="0" aria-hidden="true" style="position:absolute"><defs><pattern id="gm-rank-hatch" '
             'width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="2" height="6" '
             'fill="rgba(255,255,255,.55)"/></pattern></defs></svg>')
    return (f'<div class="gm-rank-chart" role="img" aria-label="median step time per rank">{hatch}{"".join(rows)}'
            f'<ul class="gm-tl-legend">{key}</ul></div>')


def _tiles(job: Job) -> str:
    tiles = [("Ranks analysed", f"{len(job.analysed)} / {len(job.ranks)}"), ("World size", str(job.world_size)),
             ("Median step", fmt_ms(job.step_median_ms)),
             ("Stragglers", "cannot tell" if job.same_recording else ", ".join(map(str, job.stragglers)) or "none")]
    return '<div class="gm-facts">' + "".join(
        f'<div class="gm-fact"><div class="gm-fact-label">{escape(k)}</div><div class="gm-fact-value">{escape(v)}</div></div>'
        for k, v in tiles) + "</div>"


def _table_html(job: Job) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in job.ranks:
        cells = rank_row(r, job.stragglers)
        cls = ' class="gm-straggler"' if r.rank in job.stragglers else ""
        tds = "".join(f'<td class="gm-num" data-label="{escape(COLUMNS[i])}">{escape(c)}</td>' if i in (0, 2, 3, 4, 5, 6)
                      else f'<td data-label="{escape(COLUMNS[i])}">{escape(c)}</td>' for i, c in enumerate(cells))
        body.append(f'<tr{cls} title="{escape(printable(r.path), quote=True)}">{tds}</tr>')
    return (f'<div class="gm-jobtable"><table class="gm-table gm-stack"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _findings_html(job: Job) -> str:
    n = len(job.analysed)
    out = []
    for i, jf in enumerate(job.findings):
        f = jf.finding
        where = "" if jf.scope == "job" else f" \u2014 on {len(jf.ranks)} of {n} ranks (evidence: rank {jf.evidence_rank})"
        out.append(f'<details class="gm-finding gm-sev-{escape(f.severity)}"{" open" if i == 0 else ""}><summary>'
                   f'<span class="gm-badge">{escape(severity_label(f.severity))}</span> {escape(f.title)}{escape(where)}'
                   f'<span class="gm-gain">\u2014 {escape(fmt_gain(f.est_gain, f.gain_method))}</span></summary>'
                   f'<div class="gm-finding-body">{finding_body_html(f)}</div></details>')
    return "".join(out) or '<p class="gm-muted">No finding on the job or on at least half of its ranks.</p>'


def render_fragment(job: Job) -> str:
    """The job as one scoped ``<div>`` (the notebook's ``text/html``)."""
    errors = "".join(f"<li>rank {'?' if r.rank is None else r.rank}: {escape(printable(r.error or ''))}</li>" for r in job.errors)
    others = "".join(f"<li><b>{escape(d['id'])}</b>: ranks {escape(', '.join(map(str, d['ranks'])))}</li>"
                     for d in job.other_findings)
    notes = "".join(f"<li>{escape(printable(x))}</li>" for x in job.notes)
    inner = (f"<style>{EXTRA_CSS}</style><h2>{escape(title(job))}</h2>{_tiles(job)}"
             f'<div class="gm-top">{escape(straggler_line(job))}</div>'
             f"<h3>Median step per rank</h3>{rank_chart_svg(job)}"
             f"<h3>Ranks</h3>{_table_html(job)}"
             + (f"<h3>Ranks that could not be analysed</h3><ul>{errors}</ul>" if errors else "")
             + f"<h3>Findings</h3>{_findings_html(job)}"
             + (f"<h3>Findings on fewer ranks</h3><ul>{others}</ul>" if others else "")
             + _collectives_html(job)
             + (f"<h3>Notes</h3><ul>{notes}</ul>" if notes else ""))
    return wrap(inner, static=True)


def html_document(job: Job) -> str:
    """A complete self-contained HTML page."""
    return document(title(job), render_fragment(job))
