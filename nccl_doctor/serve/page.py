"""``/``: the live page of ``run --serve`` - the job's phase, verdict, root cause and ranks, drawn
on the server from a ``Published`` look and reloaded by the browser every few seconds (no
script: every text the job wrote - a host, an exception, a call site - is escaped here, in one
place)."""

from __future__ import annotations

import html
import time

from nccl_doctor.serve.state import Published

REFRESH_S = 2

_COLOURS = {"hang": "#b00020", "crash": "#b00020", "suspect": "#b26a00", "ok": "#1b5e20",
            "unfinished": "#455a64", "not_recorded": "#455a64"}

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{padding:14px 20px;color:#fff}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0}
main{padding:10px 20px} table{border-collapse:collapse}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}
.cause{border-left:5px solid #b00020;padding:6px 12px;background:#fdecea}
code{font:13px ui-monospace,monospace}
footer{padding:10px 20px;color:#666;font-size:13px}
"""


def render(pub: Published) -> str:
    """The page of ``pub``."""
    e = html.escape
    status = pub.status()
    verdict, phase = status["verdict"], status["phase"]
    shown = verdict if verdict != "none" else phase
    colour = _COLOURS.get(verdict) or ("#b00020" if phase == "hang" else "#1565c0")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_S}'>",
        f"<title>nccl-doctor: {e(shown)}</title><style>{_STYLE}</style></head><body>",
        f"<header style='background:{colour}'><h1 id='verdict'>{e(shown.upper())}</h1>",
        f"<p id='phase'>phase: {e(phase)}"
        + (f" &middot; {e(status['message'])}" if status["message"] else "")
        + (f" &middot; quiet for {status['quiet_s']:.0f} s" if status["quiet_s"] else "")
        + "</p></header><main>",
    ]
    cause = status["root_cause"]
    if cause is not None:
        ranks = ", ".join(str(r) for r in cause["ranks"])
        parts.append(
            f"<section class='cause' id='root-cause'><h2>Root cause: {e(cause['kind'])}</h2>"
            f"<p>{e(cause['title'])}</p><p>culprit rank(s): <b id='culprit'>{e(ranks)}</b>"
            + (f" at <code>{e(cause['callsite'])}</code>" if cause["callsite"] else "")
            + "</p>" + (f"<p>{e(cause['hint'])}</p>" if cause["hint"] else "") + "</section>")
    findings = status["findings"]
    if findings:
        parts.append("<h2>Findings</h2><ul>" + "".join(
            f"<li>{e(f['severity'])} <code>{e(f['kind'])}</code>: {e(f['title'])}</li>"
            for f in findings) + "</ul>")
    if status["ranks"]:
        parts.append("<h2>Ranks</h2><table><tr><th>rank</th><th>host</th><th>calls</th>"
                     "<th>state</th><th>in</th><th>since last call</th></tr>")
        parts += [f"<tr><td>{r['rank']}</td><td>{e(r['host'])}</td><td>{r['calls']}</td>"
                  f"<td>{e(r['state'])}</td><td>{e(r['detail'])}</td>"
                  f"<td>{r['since_progress_s']:.0f} s</td></tr>" for r in status["ranks"]]
        parts.append("</table>")
    nodes = status["nodes"]
    if nodes.get("lost") or nodes.get("expected"):
        parts.append("<p>nodes: " + e(", ".join(f"{k} {v}" for k, v in sorted(nodes.items())))
                     + "</p>")
    links = ["<a href='report.json'>report.json</a>", "<a href='metrics'>metrics</a>",
             "<a href='status.json'>status.json</a>"]
    if pub.report_html:
        links.insert(0, "<a href='report.html'>the full report</a>")
    parts.append("<p>" + " &middot; ".join(links) + "</p></main>")
    stamp = time.strftime("%H:%M:%S", time.localtime(pub.at))
    parts.append(f"<footer>nccl-doctor, as seen at {stamp}; this page reloads every "
                 f"{REFRESH_S} s</footer></body></html>")
    return "".join(parts)
