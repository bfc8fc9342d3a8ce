"""The runbooks page every gpufeed serves at /runbooks (exporter/runbooks.py): docs/runbooks.md as escaped HTML whose
heading ids are the anchors the alerts' runbook_url links name."""

from __future__ import annotations

from html.parser import HTMLParser

import yaml

from exporter import examples, runbooks
from tests.rules.conftest import ALERTS, REPO


class _Ids(HTMLParser):
    """Every element's id, every tag, every href."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.tags: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for k, v in attrs:
            if k == "id" and v is not None:
                self.ids.append(v)
            if k == "href" and v is not None:
                self.hrefs.append(v)


def _parse(html: str) -> _Ids:
    p = _Ids()
    p.feed(html)
    return p


def test_the_served_runbooks_are_docs_runbooks_md() -> None:
    assert examples.files("runbooks") == [REPO / "docs" / "runbooks.md"]
    page = runbooks.page()
    assert page is not None
    assert page.decode() == runbooks.page_html((REPO / "docs" / "runbooks.md").read_text())


def test_every_alerts_runbook_anchor_is_a_heading_of_the_page() -> None:
    page = runbooks.page()
    assert page is not None
    parsed = _parse(page.decode())
    anchors = {rule["annotations"]["runbook_url"].rpartition("#")[2]
               for group in yaml.safe_load((ALERTS / "gpufeed-alerts.yml").read_text())["groups"]
               for rule in group["rules"] if "alert" in rule}
    assert len(anchors) > 20
    assert anchors - set(parsed.ids) == set()
    assert len(parsed.ids) == len(set(parsed.ids))  # no two headings share an id
    # Every link within the page lands on a heading of it.
    assert {h[1:] for h in parsed.hrefs if h.startswith("#")} - set(parsed.ids) == set()


def test_the_page_renders_code_lists_paragraphs_emphasis_and_only_the_tags_it_knows() -> None:
    page = runbooks.page()
    assert page is not None
    text = page.decode()
    parsed = _parse(text)
    assert parsed.tags == {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "pre", "code",
                           "ul", "li", "strong", "em", "a"}
    assert "<pre><code>nvidia-smi -q -i &lt;gpu&gt; | sed -n" in text
    assert "<li><code>remap_failure</code> (critical):" in text
    assert "<em>while the job runs</em>" in text
    assert "```" not in text and "**" not in text


def test_html_in_the_markdown_is_escaped_everywhere() -> None:
    hostile = (
        "# <script>alert(1)</script> heading\n\n"
        "A <img src=x onerror=alert(1)> paragraph with `<b>code</b>` and **<i>bold</i>**\n"
        "and [a link](javascript:alert(1)) and [quote](#x\"onmouseover=\"alert(1)) and [ok](#fine).\n\n"
        "- <iframe src=//evil> item\n  continued <svg/onload=alert(1)>\n\n"
        "```html\n<script>alert(2)</script>\n```\n"
    )
    html = runbooks.to_html(hostile)
    assert "<script" not in html and "<img" not in html and "<iframe" not in html and "<svg" not in html
    assert "<i>" not in html and "<b>" not in html
    assert 'href="javascript' not in html and "onmouseover=\"" not in html
    parsed = _parse(html)
    assert parsed.hrefs == ["#fine"]
    assert parsed.ids == ["scriptalert1script-heading"]  # runbook_anchor of the heading's text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert "<li>&lt;iframe src=//evil&gt; item continued &lt;svg/onload=alert(1)&gt;</li>" in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html and "<strong>&lt;i&gt;bold&lt;/i&gt;</strong>" in html


def test_a_repeated_heading_gets_githubs_numbered_id() -> None:
    parsed = _parse(runbooks.to_html("## Confirm\n\ntext\n\n## Confirm\n\n## Confirm\n"))
    assert parsed.ids == ["confirm", "confirm-1", "confirm-2"]
