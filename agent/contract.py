"""A contract document's run_kernel signature, read as text (Python or C): its parameter names, so a
message can name an argument as the package's author did."""

from __future__ import annotations

import re


def signature_names(text: str) -> list[str]:
    """The parameter names of the first run_kernel signature in a contract (Python or C)."""
    m = re.search(r"run_kernel\s*\(", text)
    if not m:
        return []
    depth, end = 1, m.end()
    while end < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    body = re.sub(r"/\*.*?\*/|//[^\n]*|#[^\n]*", "", text[m.end():end - 1], flags=re.S)
    names = []
    for part in (p.strip() for p in body.split(",")):
        part = re.sub(r"\[[^\]]*\]", "", part.split("=")[0].split(":")[0])  # defaults, annotations, C arrays
        words = re.findall(r"[A-Za-z_]\w*", part)
        if words:
            names.append(words[-1])
    return names
