"""Text broken into lines where a reader expects it: figure labels (``helpers.plots``, notebooks 00-11)
and the long printed lines of the course site's pages (``tools/build_site.py``). Standard library only."""
from __future__ import annotations

import re
import textwrap

UNIT = r"(?:[µun]?s|ms|min|h|[KMGT]i?B|B|[KMGT]?FLOP|bits?|×|%|°C|W)\b|\S*/s\b|×|%"
# Spaces a line never breaks at: a number and its unit ("14.64 ms", "26.3 GB/s"), a word and its number
# ("batch 64: 14.64", "predicted 2.05"), a dash and the number after it ("10 - 20"). A word joins only the number
# after it, and a number only a unit, so the pieces stay short ("batch 8 with 4 workers" still breaks).
GLUE = re.compile(rf"(?<=\d) (?={UNIT})|(?<=[:A-Za-z×≈~<>=]) (?=[-−]?\d)|(?<= [-−–]) (?=\d)")


def wrap(line: str, width: int, *, indent: str = "", hang: str = "") -> str:
    """``line`` broken at spaces into lines of at most ``width`` characters, the first led by ``indent``, the
    others by ``hang``: never after a hyphen ("overhead-bound", "cpu-intel-xeon"), never inside a ``GLUE`` piece,
    unless such a piece is itself wider than a line (then at any space). A word wider than a line stays whole.
    (notebook 09 and every figure's labels)"""
    for text in (GLUE.sub("\0", line), line):
        out = textwrap.fill(text, width, initial_indent=indent, subsequent_indent=hang, break_on_hyphens=False,
                            break_long_words=False, expand_tabs=False)
        if all(len(x) <= width for x in out.split("\n")):
            break
    return out.replace("\0", " ")
