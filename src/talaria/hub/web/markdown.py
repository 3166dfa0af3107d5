"""Markdown for assistant chat messages (chat.md 6.3): a small subset, rendered escape-first on the server.

``render(text)`` returns ``Markup`` safe to put in a page as it is, whatever ``text`` holds: the whole input is
HTML-escaped before it is parsed, and the parser only adds tags around escaped text. Elements: p, br, strong, em,
code, pre, ul, ol, li, blockquote, a. Attributes: ``class="language-<tag>"`` on a fenced block's code (``<tag>``
matching ``[A-Za-z0-9_+-]{1,32}``), ``start`` on an ordered list not starting at 1, and on a link ``href`` (http,
https or mailto, any case; escaped) and ``rel="noopener noreferrer nofollow"``. Nothing else, ever.

Rendered: fenced code (unclosed, it runs to the end: a streamed reply may be cut off), paragraphs (a newline inside
one is a ``<br>``), ``-``/``*``/``+`` and ``1.`` lists nested by indentation, ``>`` quotes, ``#``-``######``
headings as bold paragraphs, code spans, ``**``/``__`` bold and ``*``/``_`` italic by CommonMark's flanking rules
(so snake_case stays text), ``[text](url)``, backslash escapes (not of "`"). Text: links to other schemes or
relative ones (the whole ``[text](url)``), images, tables, raw HTML, rules, bare URLs, any other syntax.

Pure, deterministic, never raises for a ``str``. No pattern backtracks without bound, each delimiter is pushed and
popped at most once, a link target over ``MAX_URL`` characters and lists or quotes deeper than ``MAX_DEPTH`` stay
text: the work is about linear in the length of the text.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from typing import Final

from markupsafe import Markup, escape

MAX_DEPTH: Final = 8  # lists and quotes nested deeper are text: this bounds the recursion
MAX_URL: Final = 2048  # a longer link target is text: this bounds the look-ahead of each "[...]("

_FENCE: Final = re.compile(r" {0,3}(`{3,})([^`]*)")
_LANG: Final = re.compile(r"[A-Za-z0-9_+-]{1,32}")
_HEADING: Final = re.compile(r" {0,3}#{1,6}(?=[ \t]|$)")
_HEADING_END: Final = re.compile(r"(?:^|[ \t])#+\Z")  # an optional closing sequence, as in "## Title ##"
_QUOTE: Final = re.compile(r" {0,3}&gt; ?")  # the text is escaped before it is parsed
_ITEM: Final = re.compile(r" {0,3}(?:[-*+]|([0-9]{1,9})\.)(?: +|$)")
_SPECIAL: Final = re.compile(r"`+|\*+|_+|\[+|!\[|\\.?", re.DOTALL)
_TICKS: Final = re.compile(r"`+")
# One level of balanced parentheses (.../Foo_(bar)); the parentheses split the parts, so nothing backtracks.
_TARGET: Final = re.compile(r"\s*([^\s()]*(?:\([^\s()]*\)[^\s()]*)*)\s*\)")
_SAFE_SCHEME: Final = re.compile(r"(?:https?|mailto):", re.IGNORECASE)
_ESCAPABLE: Final = frozenset("!#$%&()*+,-./:;=?@[\\]^_{|}~")  # no "`"; <>"' are entities by then
_TAGS: Final = {1: ("<em>", "</em>"), 2: ("<strong>", "</strong>")}


def render(text: str) -> Markup:
    """``text`` (an assistant message's markdown) as safe HTML; see the module docstring for what is rendered."""
    clean = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")
    return Markup(_blocks(str(escape(clean)).split("\n"), 0))  # noqa: S704 - escaped above, tags only added


# ---------------------------------------------------------------- blocks


def _blocks(lines: list[str], depth: int, bare_first: bool = False) -> str:
    """The blocks of ``lines``; with ``bare_first`` (a list item) a leading paragraph has no ``<p>``."""
    out: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            i += 1
        elif fence := _FENCE.fullmatch(line):
            closing, end = re.compile(rf" {{0,3}}`{{{len(fence.group(1))},}}[ \t]*"), i + 1
            while end < n and not closing.fullmatch(lines[end]):
                end += 1
            info, code = fence.group(2).strip(), "\n".join(lines[i + 1 : end])
            css = f' class="language-{info}"' if _LANG.fullmatch(info) else ""
            out.append(f"<pre><code{css}>{code}</code></pre>")
            i = end + 1
        elif heading := _HEADING.match(line):
            content = _HEADING_END.sub("", line[heading.end() :].strip()).rstrip()
            if content:
                out.append(f"<p><strong>{_inline(content)}</strong></p>")
            i += 1
        elif depth < MAX_DEPTH and _QUOTE.match(line):
            quoted, i = _quote(lines, i, depth)
            out.append(f"<blockquote>{_blocks(quoted, depth + 1)}</blockquote>")
        elif depth < MAX_DEPTH and (item := _ITEM.match(line)):
            html, i = _list(lines, i, item, depth)
            out.append(html)
        else:
            para = [line.strip()]
            i += 1
            while i < n and lines[i].strip() and not _interrupts(lines[i], depth):
                para.append(lines[i].strip())
                i += 1
            html = _inline("\n".join(para)).replace("\n", "<br>")
            out.append(html if bare_first and not out else f"<p>{html}</p>")
    return "".join(out)


def _interrupts(line: str, depth: int) -> bool:
    """Whether ``line`` ends a paragraph: a fence, a heading, a quote, or a non-empty ``-`` or ``1.`` item."""
    if _FENCE.fullmatch(line) or _HEADING.match(line):
        return True
    if depth >= MAX_DEPTH:
        return False
    item = _ITEM.match(line)
    return bool(item and item.end() < len(line) and item.group(1) in (None, "1")) or bool(_QUOTE.match(line))


def _quote(lines: list[str], i: int, depth: int) -> tuple[list[str], int]:
    """The lines of the quote starting at ``lines[i]``, without their ``>``, and the index after it."""
    body: list[str] = []
    while i < len(lines):
        line = lines[i]
        if marker := _QUOTE.match(line):
            body.append(line[marker.end() :])
        elif line.strip() and body[-1].strip() and not _interrupts(line, depth):
            body.append(line)  # a lazy continuation of the quoted paragraph
        else:
            break
        i += 1
    return body, i


def _after_blanks(lines: list[str], i: int) -> int:
    """The index of the first line from ``i`` on that is not blank (or ``len(lines)``)."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def _list(lines: list[str], i: int, item: re.Match[str], depth: int) -> tuple[str, int]:
    """The list starting at ``lines[i]``, and the index after it. An item holds the lines indented as far as its
    text, blank lines followed by one, and lazy lines of its paragraph; an item of the other kind ends the list."""
    ordered = item.group(1) is not None
    start = int(item.group(1)) if ordered else 1
    items: list[str] = []
    while True:
        width = item.end()
        indent = " " * width
        body = [lines[i][width:]]
        i += 1
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                after = _after_blanks(lines, i)
                if after == len(lines) or not lines[after].startswith(indent):
                    break
                body += [""] * (after - i)
                i = after
            elif line.startswith(indent):
                body.append(line[width:])
                i += 1
            elif _ITEM.match(line) or _interrupts(line, depth) or not body[-1].strip():
                break
            else:
                body.append(line)
                i += 1
        items.append(f"<li>{_blocks(body, depth + 1, bare_first=True)}</li>")
        after = _after_blanks(lines, i)
        following = _ITEM.match(lines[after]) if after < len(lines) else None
        if following is None or (following.group(1) is not None) != ordered:
            break
        item, i = following, after
    tag, attrs = ("ol", f' start="{start}"' if start != 1 else "") if ordered else ("ul", "")
    return f"<{tag}{attrs}>{''.join(items)}</{tag}>", i


# ---------------------------------------------------------------- inline


class _Run:
    """An open run of ``*`` or ``_``: the tags it closed, what is left of it (literal), then the tags it opens."""

    __slots__ = ("char", "closing", "count", "opening")

    def __init__(self, char: str, count: int, closing: str) -> None:
        self.char, self.count, self.closing = char, count, closing
        self.opening: list[str] = []  # innermost first

    def html(self) -> str:
        return self.closing + self.char * self.count + "".join(reversed(self.opening))


_BLANK, _PUNCT, _WORD = 0, 1, 2
_ASCII: Final = {"": _BLANK} | {  # "": the edge of the text
    chr(c): _BLANK if chr(c).isspace() else _WORD if chr(c).isalnum() else _PUNCT for c in range(128)
}


def _kind(ch: str) -> int:
    """Blank, punctuation (Unicode P and S) or a word character."""
    if ch < "\x80":
        return _ASCII[ch]
    return _BLANK if ch.isspace() else _PUNCT if unicodedata.category(ch)[0] in "PS" else _WORD


def _find(text: str, char: str, after: int) -> int:
    """Where the next ``char`` after ``after`` is, ``len(text)`` if there is none."""
    found = text.find(char, after + 1)
    return len(text) if found < 0 else found


def _inline(text: str) -> str:
    """Inline markup of one paragraph's (escaped) text; newlines are left to the caller."""
    ticks: dict[int, list[int]] = {}  # the starts of the runs of backticks, by length
    for tick in _TICKS.finditer(text):
        ticks.setdefault(tick.end() - tick.start(), []).append(tick.start())
    parts: list[str | _Run] = []
    stacks: dict[str, list[tuple[int, _Run]]] = {"*": [], "_": []}
    pos, close_at, open_at = 0, -1, -1  # the next "]" and "[", looked for again only once passed
    while special := _SPECIAL.search(text, pos):
        i, end, ch = special.start(), special.end(), special.group()[0]
        if i > pos:
            parts.append(text[pos:i])
        pos = end
        if ch == "\\":
            escaped = special.group()[1:]
            parts.append(escaped if escaped in _ESCAPABLE else "\\")
            pos = end if escaped in _ESCAPABLE else i + 1
        elif ch == "`":  # a code span runs to the next run of as many backticks
            starts = ticks.get(end - i, [])
            k = bisect_right(starts, i)
            if k == len(starts):
                parts.append(special.group())
                continue
            code = text[end : starts[k]].replace("\n", " ")
            if len(code) > 1 and code[0] == code[-1] == " " and code.strip(" "):
                code = code[1:-1]
            parts.append(f"<code>{code}</code>")
            pos = starts[k] + end - i
        elif ch in "*_":
            parts.append(_delimit(ch, end - i, text[i - 1 : i], text[end : end + 1], len(parts), stacks))
        else:
            at = end - 1  # of "[[[" only the last "[" can open a link
            parts.append(text[i:at])
            close_at = close_at if close_at > at else _find(text, "]", at)
            open_at = open_at if open_at > at else _find(text, "[", at)
            target = None
            if close_at < open_at and text.startswith("(", close_at + 1):
                target = _TARGET.match(text, close_at + 2, min(len(text), close_at + 2 + MAX_URL))
            if target is None:
                parts.append("[")
                pos = at + 1
                continue
            label, url = text[at + 1 : close_at], target.group(1)
            if ch == "[" and label.strip() and _SAFE_SCHEME.match(url):
                parts.append(f'<a href="{url}" rel="noopener noreferrer nofollow">{_inline(label)}</a>')
            else:  # an image, or a refused link: all of it stays text
                parts.append(text[at : target.end()])
            pos = target.end()
    parts.append(text[pos:])
    return "".join(part if isinstance(part, str) else part.html() for part in parts)


def _delimit(
    char: str, count: int, before: str, after: str, index: int, stacks: dict[str, list[tuple[int, _Run]]]
) -> str | _Run:
    """A run of ``char`` at ``parts[index]``: it closes what it can, and what is left stays open if it can open.

    A run closes only the top of its own stack, and a pair drops the other character's runs opened inside it:
    tags always nest, and each run is pushed and popped at most once.
    """
    b, a = _kind(before), _kind(after)
    left = a != _BLANK and (a == _WORD or b != _WORD)
    right = b != _BLANK and (b == _WORD or a != _WORD)
    if char == "_":  # inside a word "_" neither opens nor closes
        left, right = left and (not right or b == _PUNCT), right and (not left or a == _PUNCT)
    stack, other = stacks[char], stacks["_" if char == "*" else "*"]
    closing: list[str] = []
    while right and count and stack:
        opened_at, opener = stack[-1]
        used = 2 if count >= 2 and opener.count >= 2 else 1
        opener.count -= used
        count -= used
        opener.opening.append(_TAGS[used][0])
        closing.append(_TAGS[used][1])
        if not opener.count:
            stack.pop()
        while other and other[-1][0] > opened_at:
            other.pop()
    if left and count:
        run = _Run(char, count, "".join(closing))
        stack.append((index, run))
        return run
    return "".join(closing) + char * count
