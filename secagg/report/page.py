"""The page: HTML building blocks of a self-contained ``report.html`` (escaping, numbers
that carry their ``data-key``, tables, inline SVG figures) and its inline style and
Content-Security-Policy."""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable, Sequence
from typing import Any

#: The report's file name, in a run's or a sweep's folder.
REPORT = "report.html"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1.2em 2em 3em;color:#1d232a;background:#fff}
h1{font-size:1.6em;margin:.2em 0 .1em}h2{font-size:1.25em;margin:1.6em 0 .4em;
border-bottom:1px solid #d0d6dc;padding-bottom:.2em}h3{font-size:1.05em;margin:1.1em 0 .3em}
table{border-collapse:collapse;margin:.4em 0 .8em;font-size:13px}
th,td{border:1px solid #d0d6dc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f1f4f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre,code{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #d0d6dc;padding:.6em .8em;overflow-x:auto;
white-space:pre-wrap}
.banner{padding:.7em 1em;margin:.8em 0;border-radius:4px;font-weight:600}
.fail{background:#fde8e8;border:2px solid #c0392b;color:#7b1d12}
.warn{background:#fff5da;border:1px solid #c79a1c;color:#5c4307}
.ok{background:#e7f6ec;border:1px solid #2f8a4c;color:#1b4f2c}
.muted{color:#5b6670}figure{margin:.6em 0}figure svg{max-width:100%;height:auto}
figcaption{color:#5b6670;font-size:12.5px}.kv th{width:17em}
.wide{overflow-x:auto}.wide td,.wide th{white-space:nowrap}
"""
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "font-src data:; form-action 'none'; base-uri 'none'")


# -- small HTML helpers ---------------------------------------------------------------

def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _page(title: str, body: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _fmt(v: Any, digits: int = 4) -> str:
    """A number for a person: integers with thousands separators, floats with ``digits``
    significant digits; None as an em dash."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def _num(value: Any, key: str | None = None, text: str | None = None) -> str:
    """A number in a cell; ``key`` (its dotted path in result.json) as ``data-key``."""
    attr = f' data-key="{_e(key)}"' if key else ""
    return f'<span class="num"{attr}>{_e(text if text is not None else _fmt(value))}</span>'


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()
           ) -> str:
    """A table; cells are HTML already (escape before); columns in ``numeric`` align right."""
    out = ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(
            f"<td class=\"n\">{c}</td>" if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    return ("<table class=\"kv\"><tbody>" + "".join(
        f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</tbody></table>")


def _svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no DOCTYPE)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure_html(svg: str, caption: str, ident: str) -> str:
    return f'<figure id="{_e(ident)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>'
