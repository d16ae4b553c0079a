"""A flow as HTML: the two drawings side by side, the paths and the tagged transforms (pure).

How it works: :func:`flow_section` is the HTML fragment both the offline page and the
broker's console show for a flow -- the graph as written and as rewritten
(:mod:`flowbus.flow.draw`, SVG inline), then a table of the publication -> subscription
paths with their ``S`` and ``T`` and the subexpressions computed once, and the
tagged-transform form (one select stage over a core space, the transforms by source and
subscription point). :func:`flow_page` wraps it in one self-contained page (``flowbus flow
explain FILE --html OUT.html``): styles inline, no script, nothing fetched from anywhere.
"""

from __future__ import annotations

from html import escape

from flowbus.filters.text import expr_to_text
from flowbus.flow.draw import drawings, to_svg
from flowbus.flow.graph import Graph, outputs_text
from flowbus.flow.rewrite import find_paths, rewrite, tag

__all__ = ["STYLE", "flow_page", "flow_section"]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; color: #0f172a; background: #f8fafc; }
header { background: #0f172a; color: #f8fafc; padding: 10px 20px; display: flex; gap: 24px;
  align-items: baseline; }
header a { color: #93c5fd; text-decoration: none; } header a:hover { text-decoration: underline; }
header h1 { font-size: 18px; margin: 0; }
main { padding: 12px 20px; }
.drawings { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 0; background: #fff; border: 1px solid #cbd5e1; border-radius: 6px; padding: 8px;
  overflow-x: auto; max-width: 100%; }
figcaption { font-weight: 600; margin-bottom: 4px; }
figure svg.flow-drawing { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; font-size: 13px; }
th, td { border: 1px solid #cbd5e1; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #e2e8f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; } .muted { color: #64748b; } .bad { color: #b91c1c; font-weight: 600; }
.legend span { display: inline-block; margin-right: 14px; }
"""

_LEGEND = (
    '<p class="legend">'
    '<span style="color:#1d4ed8">transform</span><span style="color:#b45309">select</span>'
    '<span style="color:#7c3aed">collapse</span><span style="color:#047857">expand</span>'
    '<span style="color:#0f766e">route [S; T]</span>'
    '<span class="muted">thick border: a publication or subscription point</span></p>'
)


def _paths_table(g: Graph) -> str:
    rows = []
    for p in find_paths(g):
        shared = ", ".join(expr_to_text(e) for e in p.shared)
        requires = ", ".join(expr_to_text(e) for e in p.step.requires)
        rows.append(
            f"<tr><td>{escape(p.source)}</td><td>{escape(p.sink)}</td>"
            f"<td>{escape('; '.join(p.via) or 'identity')}</td>"
            f"<td><code>{escape(p.step.select.to_text())}</code></td>"
            f"<td><code>{escape(outputs_text(p.step.inputs, p.step.outputs))}</code></td>"
            f"<td><code>{escape(shared)}</code></td><td><code>{escape(requires)}</code></td></tr>"
        )
    return (
        '<table class="paths"><tr><th>publication point</th><th>subscription point</th><th>via</th>'
        "<th>S</th><th>T</th><th>computed once for S and T</th><th>requires defined</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _tagged_table(g: Graph) -> str:
    plan = tag(rewrite(g))
    if not plan.subscriptions:
        return ""
    subs = "".join(
        f"<tr><td>{escape(sink)}</td><td><code>{escape(f.to_text())}</code></td></tr>"
        for sink, f in plan.subscriptions
    )
    steps = "".join(
        f"<tr><td>{escape(source)}</td><td>{escape(sink)}</td>"
        f"<td><code>{escape(outputs_text(step.inputs, step.outputs))}</code></td></tr>"
        for (source, sink), group in plan.table
        for step in group
    )
    return (
        f"<h3>Tagged transforms</h3><p>One select stage over a core space, events tagged with "
        f"<code>{escape(plan.source_field)}</code>; one subscription per subscription point:</p>"
        f'<table class="tagged"><tr><th>subscription point</th><th>filter</th></tr>{subs}</table>'
        "<p>and the transforms applied at delivery, by (source, subscription point):</p>"
        f'<table class="tagged-transforms"><tr><th>source</th><th>subscription point</th>'
        f"<th>transform</th></tr>{steps}</table>"
    )


def flow_section(g: Graph, *, live: bool = False) -> str:
    """The drawings of ``g`` before and after the rewrite, its paths and its tagged form."""
    figures = "".join(
        f'<figure class="{which}"><figcaption>{escape(d.title)}</figcaption>'
        f"{to_svg(d, live=live, ident=n)}</figure>"
        for n, (which, d) in enumerate(zip(("before", "after"), drawings(g), strict=True))
    )
    return (
        _LEGEND
        + f'<div class="drawings">{figures}'
        + "</div><h3>Publication -> subscription paths, each [S; T]</h3>"
        + _paths_table(g)
        + _tagged_table(g)
    )


def flow_page(g: Graph) -> str:
    """One self-contained HTML page of the flow ``g`` (no script; nothing to fetch)."""
    title = escape(f"flow {g.name}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body><header><h1>{title}</h1>"
        f'<span class="muted">flowbus flow explain: before and after the rewrite</span></header>'
        f"<main>{flow_section(g)}</main></body></html>\n"
    )
