"""The report's source views: syntax highlighting (pygments, or a small fallback) and diffs."""

from __future__ import annotations

import html
import re
from typing import Optional

from markupsafe import Markup

from optagent.schema import Language

# ----------------------------------------------------------------------------
# Source highlighting and diffs
# ----------------------------------------------------------------------------

PY_KEYWORDS = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def",
               "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is",
               "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"}
C_KEYWORDS = {"auto", "break", "case", "char", "const", "constexpr", "continue", "default", "do", "double", "else",
              "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "namespace", "return",
              "short", "signed", "sizeof", "static", "struct", "switch", "template", "typedef", "typename", "union",
              "unsigned", "using", "void", "volatile", "while", "bool", "true", "false", "nullptr", "__global__",
              "__device__", "__host__", "__shared__", "__restrict__", "__forceinline__", "__launch_bounds__",
              "half", "int64_t", "int32_t", "uint32_t", "size_t"}
_PY_TOKEN = re.compile(r'(?P<sd>"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\')|(?P<s>"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')'
                       r'|(?P<c1>#[^\n]*)|(?P<nd>@[\w.]+)|(?P<m>\b\d[\d_]*(?:\.\d*)?(?:e[+-]?\d+)?\b)|(?P<w>\b[A-Za-z_]\w*\b)')
_C_TOKEN = re.compile(r'(?P<cm>/\*[\s\S]*?\*/)|(?P<c1>//[^\n]*)|(?P<cp>^\s*#[^\n]*)|(?P<s>"(?:\\.|[^"\\\n])*")'
                      r'|(?P<m>\b\d[\d.]*[fFuUlL]*\b)|(?P<w>\b[A-Za-z_]\w*\b)', re.M)
FALLBACK_CSS = """.hl .k, .hl .kc { color: #7c3aed; font-weight: 600 }
.hl .s, .hl .sd { color: #047857 } .hl .sd { font-style: italic }
.hl .c1, .hl .cm { color: #6b7280; font-style: italic }
.hl .m { color: #b45309 } .hl .nd { color: #be185d } .hl .nf { color: #1d4ed8; font-weight: 600 }
.hl .cp { color: #9a3412 }"""


def _fallback_highlight(source: str, language: Language) -> str:
    """Keywords, strings, comments, numbers and decorators as spans closed at every line end."""
    cuda = language is Language.CUDA
    pattern, keywords = (_C_TOKEN, C_KEYWORDS) if cuda else (_PY_TOKEN, PY_KEYWORDS)
    out, pos, after_def = [], 0, False

    def span(cls: str, text: str) -> str:
        return "\n".join(f'<span class="{cls}">{html.escape(part)}</span>' if part else "" for part in text.split("\n"))

    for m in pattern.finditer(source):
        out.append(html.escape(source[pos:m.start()]))
        kind, text = m.lastgroup, m.group()
        if kind == "w":
            if text in keywords:
                out.append(span("kc" if text in ("True", "False", "None", "true", "false", "nullptr") else "k", text))
                after_def = text in ("def", "class")
                pos = m.end()
                continue
            out.append(span("nf", text) if after_def else html.escape(text))
            after_def = False
        else:
            out.append(span(kind, text))
        pos = m.end()
    out.append(html.escape(source[pos:]))
    return "".join(out)


def _pygments():
    try:
        import pygments  # noqa: F401
    except ImportError:
        return None
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import CudaLexer, PythonLexer

    return highlight, HtmlFormatter, {Language.CUDA.fence: CudaLexer, Language.TRITON.fence: PythonLexer}


USE_PYGMENTS = True  # tests turn it off to exercise the fallback


def highlight_css() -> str:
    lib = _pygments() if USE_PYGMENTS else None
    if lib is None:
        return FALLBACK_CSS
    rules = lib[1](style="default").get_style_defs(".hl").splitlines()
    return "\n".join(r for r in rules if r.startswith(".hl ") and not r.startswith(".hl .hll"))


def highlight_lines(source: str, language: Language) -> list[Markup]:
    """The source as highlighted HTML, one balanced fragment per line."""
    lib = _pygments() if USE_PYGMENTS else None
    if lib is None:
        text = _fallback_highlight(source, language)
    else:
        highlight, formatter, lexers = lib
        lexer = lexers[language.fence](stripnl=False, ensurenl=False)
        text = highlight(source, lexer, formatter(nowrap=True))
    lines = text.split("\n")
    if lines and lines[-1] == "" and source.endswith("\n"):
        lines.pop()
    return [Markup(line) for line in lines]  # noqa: S704 - escaped by the highlighter


def diff_lines(diff: str) -> list[tuple[str, str]]:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "meta"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


def error_summary(text: Optional[str], limit: int = 240) -> Optional[str]:
    """The first line of an error, and its last when there are several (a traceback's or compiler's verdict)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return None
    out = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return out if len(out) <= limit else out[: limit - 1] + "…"


def shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


