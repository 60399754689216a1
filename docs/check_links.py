"""Checks every internal link of the built HTML site (`make docs` runs it after Sphinx):
each relative href/src must name a file of the site, and each #fragment an id (or name) in the
page it points to. External links (http:, https:, mailto:) are not followed: the check needs no
network. Exits 1 and lists the broken links, else prints how many links it checked.

    python docs/check_links.py docs/_build/html
"""

import html.parser
import os
import sys
import urllib.parse

EXTERNAL = ("http:", "https:", "mailto:", "ftp:", "data:", "javascript:")


class _Page(html.parser.HTMLParser):
    """The links and the anchor ids of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if value is None:
                continue
            if key in ("id", "name"):
                self.ids.add(value)
            elif key in ("href", "src") and not (tag == "link" and key == "href" and value.startswith("#")):
                self.links.append(value)


def _parse(path, cache):
    if path not in cache:
        page = _Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        cache[path] = page
    return cache[path]


def broken_links(root):
    """[(page, link, why)] over every .html file under `root`, and the number of links checked."""
    cache, broken, checked = {}, [], 0
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".html"):
                continue
            page_path = os.path.join(dirpath, name)
            for link in _parse(page_path, cache).links:
                if link.lower().startswith(EXTERNAL):
                    continue
                checked += 1
                parts = urllib.parse.urlsplit(link)
                target = page_path
                if parts.path:
                    target = os.path.normpath(os.path.join(dirpath, urllib.parse.unquote(parts.path)))
                    if os.path.isdir(target):
                        target = os.path.join(target, "index.html")
                rel = os.path.relpath(page_path, root)
                if not os.path.isfile(target):
                    broken.append((rel, link, "no such file"))
                elif parts.fragment and target.endswith(".html"):
                    fragment = urllib.parse.unquote(parts.fragment)
                    if fragment not in _parse(target, cache).ids:
                        broken.append((rel, link, "no anchor %r there" % fragment))
    return broken, checked


def main(argv=None):
    root = (argv or sys.argv[1:] or ["docs/_build/html"])[0]
    if not os.path.isfile(os.path.join(root, "index.html")):
        print("check_links: %s has no index.html (build the site first: make docs)" % root)
        return 1
    broken, checked = broken_links(root)
    for page, link, why in broken:
        print("%s: broken link %s (%s)" % (page, link, why))
    if broken:
        print("check_links: %d of %d internal links are broken" % (len(broken), checked))
        return 1
    print("check_links: %d internal links, all resolve" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
