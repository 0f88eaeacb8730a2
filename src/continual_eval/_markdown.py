"""Markdown text that renders as the text itself: one escaping rule for every Markdown the package
writes (``report.md``, the seed-statistics tables)."""

from __future__ import annotations

import html
import re
import unicodedata

__all__ = ["escape_markdown"]

_HTML_SPECIAL = frozenset("&<>\"'")
#: escaped everywhere: inline markup (code, emphasis, links and images), GFM tables and
#: strikethrough, math ($), heading closers (#) and URL autolinks (:)
_MARKDOWN_INLINE = frozenset("\\`*_[]|~$#:")
#: a line that starts with one of these, or with digits and one of ".)", is a list item or an
#: underline; escaped at the start of the text
_LINE_START = re.compile(r"[-+=]|\d{1,9}[.)]")
_INVISIBLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def escape_markdown(text: str) -> str:
    """``text`` as literal Markdown text on one line (CommonMark/GFM): HTML specials as entities
    (``<`` -> ``&lt;``), inline markup characters backslash-escaped (``` ` ``` ``*`` ``_`` ``[``
    ``]`` ``|`` ``~`` ``$`` ``#`` ``:`` ``\\``), a leading list or underline marker escaped,
    and line breaks, control and format characters (bidi overrides, zero-width) written as
    ``\\uXXXX``-style escapes. It renders as the original text, never as markup."""
    out = []
    for ch in text:
        if ch in _HTML_SPECIAL:
            out.append(html.escape(ch, quote=True))
        elif ch in _MARKDOWN_INLINE:
            out.append("\\" + ch)
        elif unicodedata.category(ch) in _INVISIBLE:
            out.append("\\" + ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    escaped = "".join(out)
    marker = _LINE_START.match(escaped)
    if marker is not None:
        end = marker.end() - 1
        escaped = f"{escaped[:end]}\\{escaped[end:]}"
    return escaped
