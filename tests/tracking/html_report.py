"""Parse an ``mmfl report`` HTML file: its sections, their text, tables and images."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict] = {}
        self._sec: dict | None = None
        self._table: dict | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.scripts = 0
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._sec = self.sections[a["id"]] = {"text": [], "tables": [], "images": []}
        elif tag == "table" and self._sec is not None:
            self._table = {"header": [], "rows": []}
            self._sec["tables"].append(self._table)
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "img" and self._sec is not None:
            self._sec["images"].append(a.get("src", ""))
        elif tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if key in a:
                self.links.append(a[key])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if not self._table["header"] and not self._table["rows"]:
                self._table["header"] = self._row
            else:
                self._table["rows"].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "section":
            self._sec = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._sec is not None:
            self._sec["text"].append(data)

    # -- access
    def text(self, sid: str) -> str:
        return " ".join("".join(self.sections[sid]["text"]).split())

    def tables(self, sid: str) -> list[dict]:
        return self.sections[sid]["tables"]

    def table(self, sid: str, index: int = 0) -> list[list[str]]:
        return self.tables(sid)[index]["rows"]

    def header(self, sid: str, index: int = 0) -> list[str]:
        return self.tables(sid)[index]["header"]

    def images(self, sid: str) -> list[str]:
        return self.sections[sid]["images"]


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page
