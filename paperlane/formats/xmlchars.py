"""The one rule for characters XML 1.0 cannot hold, applied wherever a string from outside (a file name, a document
name, an engine's text or its name) enters an archive format (ALTO, PAGE XML, hOCR, METS).

XML 1.0 allows ``#x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]``: the other control
characters (U+0000 to U+001F but tab, newline and carriage return), lone surrogates (U+D800 to U+DFFF) and the
non-characters U+FFFE and U+FFFF cannot be written, not even escaped. Each of them becomes U+FFFD (the replacement
character), one for one, so a name keeps its length and a reader sees where something was; everything XML allows
is kept and escaped by lxml as usual (``<``, ``&``, quotes).
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` with every character XML 1.0 forbids replaced by U+FFFD (see the module docstring)."""
    return FORBIDDEN.sub(REPLACEMENT, text)
