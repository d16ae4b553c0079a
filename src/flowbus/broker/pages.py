"""The console's HTML pages: overview, a flow, the ring, the spaces, live events (pure: data
in, HTML out).

How it works: each page is built from the plain data of :mod:`flowbus.broker.status` (and,
for a flow, the drawings of :mod:`flowbus.flow.html`) with every value escaped, under one
header of links. The counts stay live without reloading: a few lines of inline script fetch
``/api/state`` each second and write the numbers into the elements that name them
(``data-stat``, ``data-space-stat``, ``data-space-rate``, and the ``data-count`` place each
space has on a flow's drawing), rates from the difference between two polls. The ring page
reloads itself every five seconds instead. The live page subscribes with STOMP over the
console's WebSocket (``/stomp``), through stomp.js as the console serves it
(``/static/stomp.umd.min.js``), and shows each event as text, never as HTML (events are user
data). Nothing is fetched from anywhere but the broker.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from flowbus.flow.deploy import Deployment
from flowbus.flow.html import STYLE, flow_section

__all__ = ["LIVE_KEPT", "flow_page", "live_page", "not_found", "overview_page", "ring_page", "spaces_page"]

LIVE_KEPT = 200
"""The events the live page keeps on show (the newest; its count goes on)."""

_SCRIPT = r"""
const shown = n => (n === undefined || n === null) ? "" : String(n);
let before = null;
async function tick() {
  const at = document.getElementById("updated");
  try {
    const reply = await fetch("/api/state", {cache: "no-store"});
    const s = await reply.json();
    const now = performance.now() / 1000;
    const spaces = {};
    for (const sp of s.spaces) spaces[sp.name] = sp;
    const rate = (name, key) => {
      if (!before || !spaces[name] || !before.spaces[name]) return 0;
      return (spaces[name][key] - before.spaces[name][key]) / Math.max(now - before.at, 0.001);
    };
    document.querySelectorAll("[data-stat]").forEach(e => {
      e.textContent = shown(s.broker[e.dataset.stat]);
    });
    document.querySelectorAll("[data-space-stat]").forEach(e => {
      const [name, key] = e.dataset.spaceStat.split("|");
      e.textContent = spaces[name] ? shown(spaces[name][key]) : "0";
    });
    document.querySelectorAll("[data-space-rate]").forEach(e => {
      const [name, key] = e.dataset.spaceRate.split("|");
      e.textContent = rate(name, key).toFixed(1);
    });
    document.querySelectorAll("[data-count], [data-rate]").forEach(e => {
      const name = (e.dataset.count || e.dataset.rate).replace(/\.(pub|sub)$/, "");
      const sp = spaces[name];
      if (!sp) return;
      const per_s = rate(name, "in") + rate(name, "deliveries");
      e.textContent = e.dataset.count !== undefined ? `pub ${sp.in} · del ${sp.deliveries}`
        : `${sp.subscriptions.length} subs · ${per_s.toFixed(0)}/s`;
    });
    const drawn = document.querySelector("[data-flow]");
    const arcs = drawn && s.arcs ? (s.arcs[drawn.dataset.flow] || {}) : {};
    document.querySelectorAll("[data-arc-count]").forEach(e => {
      const name = e.dataset.arcCount, n = arcs[name] || 0;
      const was = before && before.arcs[name] !== undefined ? before.arcs[name] : n;
      const per_s = before ? (n - was) / Math.max(now - before.at, 0.001) : 0;
      e.textContent = `${n} events · ${per_s.toFixed(0)}/s`;
    });
    before = {at: now, spaces: spaces, arcs: arcs};
    at.textContent = "live, " + new Date().toLocaleTimeString();
  } catch (err) {
    at.textContent = "the broker does not answer";
  }
}
tick();
setInterval(tick, 1000);
"""


def _page(title: str, address: str, body: str, *, live: bool = True, refresh: int = 0) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    script = f"<script>{_SCRIPT}</script>" if live else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{meta}'
        f"<title>{escape(title)} · flowbus {escape(address)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>flowbus {escape(address)}</h1>"
        '<a href="/">overview</a><a href="/ring">ring</a><a href="/spaces">spaces</a>'
        '<a href="/live">live</a><a href="/metrics">metrics</a>'
        '<span id="updated" class="muted"></span></header>'
        f"<main><h2>{escape(title)}</h2>{body}</main>{script}</body></html>"
    )


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of cells given as HTML (escape what goes in)."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{th}</tr>{body}</table>'


def overview_page(state: dict[str, Any]) -> str:
    b = state["broker"]
    stats = [
        ("node id", "node_id"),
        ("overlay", "overlay"),
        ("subscriptions served here", "subscriptions"),
        ("client sessions", "sessions"),
        ("events published here", "published"),
        ("deliveries made here", "delivered"),
        ("spilled to disk", "spilled"),
        ("in custody", "in_custody"),
        ("queued in memory", "queued_in_memory"),
    ]
    rows = [[escape(label), f'<span data-stat="{key}">{escape(str(b[key]))}</span>'] for label, key in stats]
    peers = ", ".join(escape(p) for p in b["peers"]) or "none"
    flows = "".join(f'<li><a href="/flows/{escape(n)}">{escape(n)}</a></li>' for n in b["flows"])
    body = (
        _table(["", "now"], rows, "overview")
        + f"<p>Linked to: {peers}</p>"
        + "<h3>Deployed flows</h3>"
        + (f'<ul class="flows">{flows}</ul>' if flows else '<p class="muted">no flow is deployed</p>')
    )
    return _page("Overview", b["address"], body)


def flow_page(address: str, d: Deployment, section: str) -> str:
    """A deployed flow: ``section`` is :func:`~flowbus.flow.html.flow_section` of its graph, live."""
    body = (
        f"<p>Version <code>{escape(d.version)}</code>. In each space, what this broker counts of it: "
        "events published here (pub), deliveries here (del), subscriptions here, events a second. "
        "Above each arc and route, the events this broker saw pass it (as the edge of its "
        "subscribers, as the owner of a part of the flow's states), and how many a second.</p>"
        + f'<div data-flow="{escape(d.name)}">{section}</div>'
    )
    return _page(f"Flow {d.name}", address, body)


def flow_drawing(d: Deployment) -> str:
    """The part of a flow's page that depends only on the flow (drawn once per version)."""
    return flow_section(d.graph, live=True)


def _ring_svg(brokers: list[dict[str, Any]]) -> str:
    """The brokers round a circle, clockwise from this one, and the links from it."""
    n = len(brokers)
    size, r = 360, 130
    at = [
        (size / 2 + r * math.sin(2 * math.pi * k / n), size / 2 - r * math.cos(2 * math.pi * k / n))
        for k in range(n)
    ]
    parts = [f'<circle cx="{size / 2}" cy="{size / 2}" r="{r}" fill="none" stroke="#cbd5e1"/>']
    for k in range(1, n):
        parts.append(
            f'<line x1="{at[0][0]:.1f}" y1="{at[0][1]:.1f}" x2="{at[k][0]:.1f}" y2="{at[k][1]:.1f}" '
            'stroke="#1d4ed8" stroke-width="1.4"/>'
        )
    for (x, y), b in zip(at, brokers, strict=True):
        fill = "#fecaca" if b["suspected"] else "#dbeafe" if b["link"] else "#fde68a"
        parts.append(
            f'<g class="broker" data-address="{escape(b["address"])}">'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="{fill}" stroke="#334155"/>'
            f'<text x="{x:.1f}" y="{y - 14:.1f}" text-anchor="middle">'
            f"{escape(b['address'])}</text></g>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="ring-drawing" width="{size}" height="{size}" '
        f'font-family="monospace" font-size="11">{"".join(parts)}</svg>'
    )


def ring_page(state: dict[str, Any]) -> str:
    ring, address = state["ring"], state["broker"]["address"]
    if not ring["joined"]:
        return _page("Ring", address, "<p>Not a member of a ring (yet).</p>", refresh=5)
    rows = [
        [
            escape(str(b["id"])),
            escape(b["address"]),
            escape(", ".join(b["roles"])),
            escape(b["link"]),
            "" if b["load"] is None else escape(f"{b['load']:.2f}"),
            '<span class="bad">suspected</span>' if b["suspected"] else "alive",
        ]
        for b in ring["brokers"]
    ]
    body = (
        f'<div class="drawings"><figure>{_ring_svg(ring["brokers"])}</figure><div>'
        + _table(["ring id", "address", "to this broker", "link class", "load", "state"], rows, "ring")
        + f"<p>Suspected: {escape(', '.join(map(str, ring['suspects'])) or 'none')}. "
        f"Declared dead: {escape(', '.join(map(str, ring['dead'])) or 'none')}. "
        f"State taken over from: {escape(', '.join(map(str, ring['taken_over'])) or 'none')}. "
        f"Backups on {ring['backup']} neighbours. Changes of this view so far: {ring['changes']}.</p>"
        '<p class="muted">Loads are the last each neighbour sent in its heartbeat (1.0: at its limit). '
        "This page reloads every 5 s.</p></div></div>"
    )
    return _page("Ring", address, body, live=False, refresh=5)


def spaces_page(state: dict[str, Any]) -> str:
    rows, subs = [], []
    for sp in state["spaces"]:
        name = escape(sp["name"])
        flow = f'<a href="/flows/{escape(sp["flow"])}">{escape(sp["flow"])}</a>' if sp["flow"] else ""
        live = [f'<span data-space-stat="{name}|{k}">{sp[k]}</span>' for k in ("in", "deliveries", "out")]
        rates = [f'<span data-space-rate="{name}|{k}">0.0</span>' for k in ("in", "deliveries")]
        queue = [f'<span data-space-stat="{name}|{k}">{sp[k]}</span>' for k in ("queued", "on_disk")]
        cells = [name, flow, escape(sp["kind"]), live[0], rates[0], live[1], rates[1], live[2], *queue]
        rows.append([*cells, str(len(sp["subscriptions"]))])
        for s in sp["subscriptions"]:
            subs.append(
                [
                    name,
                    escape(s["id"]),
                    escape(s["client"]),
                    f"<code>{escape(s['filter'])}</code>",
                    "durable" if s["durable"] else "",
                    escape(s["interpretation"]),
                    "attached" if s["attached"] else "away",
                    str(s["queued"]),
                    str(s["on_disk"]),
                ]
            )
    head = [
        "space",
        "flow",
        "kind",
        "published",
        "/s",
        "delivered",
        "/s",
        "sent",
        "queued",
        "on disk",
        "subs",
    ]
    sub_head = [
        "space",
        "subscription",
        "client",
        "filter",
        "",
        "interpretation",
        "client",
        "queued",
        "on disk",
    ]
    body = (
        _table(head, rows, "spaces")
        + "<h3>Subscriptions served here</h3>"
        + (_table(sub_head, subs, "subscriptions") if subs else '<p class="muted">none</p>')
    )
    return _page("Spaces and subscriptions", state["broker"]["address"], body)


_LIVE_SCRIPT = r"""
const KEPT = Number(document.getElementById("live-events").dataset.kept);
const form = document.getElementById("live-form");
const said = document.getElementById("live-status");
const counter = document.getElementById("live-count");
const shown = document.getElementById("live-events");
let client = null;
let count = 0;

function say(text, bad = false) {
  said.textContent = text;
  said.className = bad ? "bad" : "muted";
}

function show(message) {  // (an event is user data: written as text, never as HTML)
  count += 1;
  counter.textContent = String(count);
  const item = document.createElement("li");
  const when = document.createElement("span");
  when.className = "muted";
  when.textContent = `${new Date().toLocaleTimeString()} ${message.headers["event-id"] || ""} `;
  const event = document.createElement("code");
  event.textContent = message.body;
  item.append(when, event);
  shown.prepend(item);
  while (shown.children.length > KEPT) shown.lastElementChild.remove();
}

async function stop() {
  const was = client;
  client = null;
  if (was) await was.deactivate();
}

function subscribe(space, kind, text, passcode) {
  const headers = {receipt: "subscribed"};
  if (text) headers[kind] = text;  // ("filter": flowbus filter text, "selector": JMS)
  const c = new StompJs.Client({
    brokerURL: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/stomp`,
    connectHeaders: passcode ? {passcode: passcode} : {},
    reconnectDelay: 0,  // (an ERROR says what is wrong: the same subscription would fail again)
  });
  c.onConnect = () => {
    c.watchForReceipt("subscribed", () => say(`subscribed to ${space}`));
    c.subscribe(`/topic/${space}`, show, headers);
  };
  c.onStompError = frame => say(frame.headers.message || "the broker refused", true);
  c.onWebSocketClose = () => {
    if (client === c && said.className !== "bad") say("the connection closed", true);
  };
  client = c;
  say("connecting");
  c.activate();
}

form.addEventListener("submit", async e => {
  e.preventDefault();
  await stop();
  const f = new FormData(form);
  count = 0;
  counter.textContent = "0";
  shown.replaceChildren();
  subscribe(f.get("space").trim(), f.get("kind"), f.get("text").trim(), f.get("passcode"));
});
document.getElementById("live-stop").addEventListener("click", async () => {
  await stop();
  say("stopped");
});
"""


def live_page(state: dict[str, Any]) -> str:
    """Events of a space as they come, through a flowbus filter or a JMS selector (STOMP over
    the console's WebSocket, see the module note)."""
    spaces = "".join(f'<option value="{escape(sp["name"])}">' for sp in state["spaces"])
    body = (
        "<p>Subscribe to a space through a flowbus filter or a JMS selector: the matching events "
        f"appear as the broker delivers them, newest on top (the last {LIVE_KEPT} kept). The page "
        "speaks STOMP over this console's WebSocket (<code>/stomp</code>); the token is needed "
        "when the broker checks rights.</p>"
        '<form id="live-form" class="live">'
        '<p><label>space <input name="space" list="live-spaces" required></label>'
        f'<datalist id="live-spaces">{spaces}</datalist> '
        '<label><input type="radio" name="kind" value="filter" checked> flowbus filter</label> '
        '<label><input type="radio" name="kind" value="selector"> JMS selector</label></p>'
        '<p><input name="text" size="80" placeholder="price > 100 (empty: every event)"> '
        '<label>token <input name="passcode" type="password" autocomplete="off"></label> '
        '<button type="submit">subscribe</button> <button type="button" id="live-stop">stop</button></p>'
        "</form>"
        '<p><span id="live-status" class="muted">not subscribed</span> · '
        '<span id="live-count">0</span> events</p>'
        f'<ul id="live-events" class="live-events" data-kept="{LIVE_KEPT}"></ul>'
        "<style>.live-events { list-style: none; padding: 0; } "
        ".live-events li { border-bottom: 1px solid #e2e8f0; padding: 2px 0; font-size: 12px; }</style>"
        '<script src="/static/stomp.umd.min.js"></script>'
        f"<script>{_LIVE_SCRIPT}</script>"
    )
    return _page("Live events", state["broker"]["address"], body, live=False)


def not_found(address: str, what: str) -> str:
    return _page("Not found", address, f"<p>{escape(what)}</p>", live=False)
