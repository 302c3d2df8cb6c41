"""Text from reports (check names, summaries, reasons, device keys) written into Markdown
(matrix.md, summary.md): it stays the text it is. A `|` cannot end a table cell, a newline cannot
start a heading, `[x](javascript:...)` is no link and `<script>` no HTML (hostile probe 2, L18)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_PUNCTUATION = re.compile(r"([\\`*\[\]|])")


def md_text(text: object) -> str:
    """`text` as literal Markdown inline text, on one line."""
    out = _CONTROL.sub(" ", str(text))
    out = out.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _PUNCTUATION.sub(r"\\\1", out)


def md_code(text: object) -> str:
    """`text` inside a `code span`, on one line: no backtick ends it, no `|` ends its table cell."""
    return "`" + _CONTROL.sub(" ", str(text)).replace("`", "'").replace("|", "\\|") + "`"
