"""docs/runbooks.md as the HTML page every gpufeed serves at ``/runbooks``: the default ``runbook_url`` of the
shipped alerts is ``http://<instance>/runbooks#<alertname>``, the alerting exporter's own copy (docs/deployment.md).

The runbooks ship with the package (:mod:`exporter.examples`, kind ``runbooks``: read in place in a checkout,
``exporter/data/runbooks/`` in a wheel), so the page is the runbooks of the version that raised the alert. The
renderer knows the Markdown that file uses and nothing more -- headings (with the ids GitHub gives them, which
the alerts' links name), fenced code, ``-`` lists, paragraphs, inline code, bold, italics, links -- and escapes
every text: the page runs no script and loads nothing.

Standard library only.
"""

from __future__ import annotations

import functools
import html
import re

from exporter import examples
from exporter.vocabulary import runbook_anchor

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"(?<![\w*])\*(?![\s*])(.+?)(?<![\s*])\*(?![\w*])")
# Links within the page and to the web only: a relative link (derived.md) names a file this server does not have.
_LINK = re.compile(r"\[([^\]]+)\]\((#[\w-]+|https?://[^)\s]+)\)")
_HEADING = re.compile(r"(#{1,6}) +(.*)")
_ITEM = re.compile(r"(?:[-*]|[0-9]+\.) +(.*)")
STYLE = ("body{font-family:sans-serif;max-width:60em;margin:auto;padding:0 1em;line-height:1.4}"
         "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}code{background:#f4f4f4}")
# The response header: no script, no frame, nothing fetched; the inline style above only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def inline(text: str) -> str:
    """One line's text as HTML: escaped, with `code`, **bold**, *italics* and [links](#anchor)."""
    out = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        styled = _EM.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", html.escape(part)))
        out.append(_LINK.sub(r'<a href="\2">\1</a>', styled))
    return "".join(out)


def to_html(markdown: str) -> str:
    """The body of the page for ``markdown`` (the subset docs/runbooks.md uses)."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []
    seen: dict[str, int] = {}

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    lines = iter(markdown.splitlines())
    for line in lines:
        heading, item = _HEADING.fullmatch(line), _ITEM.fullmatch(line)
        if line.startswith("```"):
            flush()
            code = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                code.append(inner)
            out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
        elif heading:
            flush()
            level, text = len(heading.group(1)), heading.group(2).strip()
            anchor = runbook_anchor(text)
            # GitHub's rule for a repeated heading: the second one gets -1, the third -2.
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            uid = anchor if n == 0 else f"{anchor}-{n}"
            out.append(f'<h{level} id="{html.escape(uid)}">{inline(text)}</h{level}>')
        elif item:
            if para:
                flush()
            items.append(item.group(1))
        elif not line.strip():
            flush()
        elif items and line.startswith(" "):
            items[-1] += " " + line.strip()  # an item's continuation line
        else:
            if items:
                flush()
            para.append(line.strip())
    flush()
    return "\n".join(out) + "\n"


def page_html(markdown: str, title: str = "gpufeed runbooks") -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n{to_html(markdown)}</body></html>\n")


@functools.cache
def page() -> bytes | None:
    """The served page, rendered once; None where this installation ships no runbooks."""
    shipped = examples.files("runbooks")
    if not shipped:
        return None
    return page_html(shipped[0].read_text(encoding="utf-8")).encode()
