"""The assistant-message markdown renderer (chat.md 6.3): exact HTML for each rule and each refusal, and an
HTML-parser check, over adversarial and random inputs, that only the allowed elements and attributes ever appear."""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser

import jinja2
import pytest
from markupsafe import Markup

from talaria.hub.web.markdown import MAX_DEPTH, render

REL = 'rel="noopener noreferrer nofollow"'
ALLOWED = frozenset({"p", "br", "strong", "em", "code", "pre", "ul", "ol", "li", "blockquote", "a"})
LANGUAGE = re.compile(r"language-[A-Za-z0-9_+-]{1,32}")
SAFE_HREF = re.compile(r"(?:https?|mailto):", re.IGNORECASE)


class _Elements(HTMLParser):
    """Fails on any element, attribute, comment, declaration or processing instruction outside the allowed set."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.seen: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in ALLOWED, tag
        self.seen.append(tag)
        names = [name for name, _ in attrs]
        values = dict(attrs)
        if tag == "a":
            assert sorted(names) == ["href", "rel"], attrs
            assert values["rel"] == "noopener noreferrer nofollow"
            assert SAFE_HREF.match(values["href"] or ""), attrs
        elif tag == "code" and names:
            assert names == ["class"] and LANGUAGE.fullmatch(values["class"] or ""), attrs
        elif tag == "ol" and names:
            assert names == ["start"] and (values["start"] or "").isdigit(), attrs
        else:
            assert not names, (tag, attrs)
        if tag != "br":
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raise AssertionError(f"self-closing <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, f"</{tag}> does not close the innermost element"

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"comment {data!r}")

    def handle_decl(self, decl: str) -> None:
        raise AssertionError(f"declaration {decl!r}")

    def handle_pi(self, data: str) -> None:
        raise AssertionError(f"processing instruction {data!r}")

    def unknown_decl(self, data: str) -> None:
        raise AssertionError(f"declaration {data!r}")


def assert_safe(html: str) -> list[str]:
    """The elements of ``html``, in order, after checking them; every element is closed, in order."""
    parser = _Elements()
    parser.feed(html)
    parser.close()
    assert parser.open == [], parser.open
    return parser.seen


def test_the_safety_check_itself_refuses_what_it_must() -> None:
    """Guards the guard: a check that passed everything would make the adversarial test vacuous."""
    assert_safe(f'<p><a href="https://x.example/" {REL}>x</a><code class="language-py">y</code></p>')
    for bad in (
        "<img src=x>",
        "<script>alert(1)</script>",
        '<p onclick="x">y</p>',
        f'<a href="javascript:alert(1)" {REL}>x</a>',
        f'<a href="https://x.example/" {REL} onmouseover="y">x</a>',
        '<a href="https://x.example/">x</a>',
        '<code class="x">y</code>',
        "<!-- hidden -->",
        "<p><em>x</p></em>",
        "<p>open",
    ):
        with pytest.raises(AssertionError):
            assert_safe(bad)


def html(text: str) -> str:
    out = render(text)
    assert isinstance(out, Markup)
    assert_safe(out)
    return str(out)


# ---------------------------------------------------------------- escape first


def test_raw_html_is_escaped_text() -> None:
    assert html("<img src=x onerror=alert(1)>") == "<p>&lt;img src=x onerror=alert(1)&gt;</p>"
    assert html("<script>alert(1)</script>") == "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"
    assert html("say \"hi\" & 'bye' &amp; &copy;") == "<p>say &#34;hi&#34; &amp; &#39;bye&#39; &amp;amp; &amp;copy;</p>"
    assert html("<!-- c --> <![CDATA[x]]> <?php ?>") == "<p>&lt;!-- c --&gt; &lt;![CDATA[x]]&gt; &lt;?php ?&gt;</p>"


def test_the_result_is_markup_that_jinja_does_not_escape_again() -> None:
    page = jinja2.Environment(autoescape=True).from_string("<div>{{ body }}</div>")
    assert page.render(body=render("**<b>**")) == "<div><p><strong>&lt;b&gt;</strong></p></div>"


def test_empty_blank_and_line_endings() -> None:
    assert html("") == ""
    assert html(" \n\t\n") == ""
    assert html("a\r\nb\rc") == "<p>a<br>b<br>c</p>"
    assert html("a\x00<b>") == "<p>a\ufffd&lt;b&gt;</p>"


# ---------------------------------------------------------------- fenced code


def test_a_fenced_block_with_a_tag_gets_a_language_class_and_verbatim_escaped_content() -> None:
    text = '```python\nif a < b and c > d:\n    print("**no** _markup_ [x](https://x.example)")\n```'
    assert html(text) == (
        '<pre><code class="language-python">if a &lt; b and c &gt; d:\n'
        "    print(&#34;**no** _markup_ [x](https://x.example)&#34;)</code></pre>"
    )
    assert html("```c++\nx\n```") == '<pre><code class="language-c++">x</code></pre>'
    assert html("``` objective-c_2 \nx\n```") == '<pre><code class="language-objective-c_2">x</code></pre>'
    assert html("```" + "a" * 32 + "\nx\n```") == f'<pre><code class="language-{"a" * 32}">x</code></pre>'


@pytest.mark.parametrize("info", ["", "py thon", "a" * 33, "<script>", 'x" onclick="y', "ru.by", "c#", "é"])
def test_any_other_info_string_gives_no_class(info: str) -> None:
    assert html(f"```{info}\nx\n```") == "<pre><code>x</code></pre>"


def test_fences_close_with_as_many_backticks_or_more_and_an_unclosed_one_runs_to_the_end() -> None:
    assert html("````\na\n```\nb\n`````\nafter") == "<pre><code>a\n```\nb</code></pre><p>after</p>"
    assert html("```\na\n``` x\n```") == "<pre><code>a\n``` x</code></pre>"
    assert html("```js\nlet a = 1;\n\n# not a heading\n> not a quote") == (
        '<pre><code class="language-js">let a = 1;\n\n# not a heading\n&gt; not a quote</code></pre>'
    )
    assert html("```") == "<pre><code></code></pre>"
    assert html("text\n```\ncode\n```\nmore") == "<p>text</p><pre><code>code</code></pre><p>more</p>"
    assert html("```a`b```") == "<p><code>a`b</code></p>"  # a backtick in the info string: not a fence


# ---------------------------------------------------------------- inline


def test_inline_code_keeps_its_content_literal() -> None:
    assert html("run `rm -rf *tmp*` now") == "<p>run <code>rm -rf *tmp*</code> now</p>"
    assert html("`<b>` and `[x](https://x.example)`") == (
        "<p><code>&lt;b&gt;</code> and <code>[x](https://x.example)</code></p>"
    )
    assert html("``a ` b``") == "<p><code>a ` b</code></p>"
    assert html("` x `, `  `") == "<p><code>x</code>, <code>  </code></p>"
    assert html("`a\nb`") == "<p><code>a b</code></p>"
    assert html("`unclosed and ``mismatched") == "<p>`unclosed and ``mismatched</p>"


def test_bold_and_italic() -> None:
    assert html("**a** __b__ *c* _d_") == "<p><strong>a</strong> <strong>b</strong> <em>c</em> <em>d</em></p>"
    assert html("***both***") == "<p><em><strong>both</strong></em></p>"
    assert html("*an **inner** one*") == "<p><em>an <strong>inner</strong> one</em></p>"
    assert html("**bold**text and 2*3*4") == "<p><strong>bold</strong>text and 2<em>3</em>4</p>"
    assert html("a * b * c, **unclosed, *x") == "<p>a * b * c, **unclosed, *x</p>"
    assert html("*x\ny*") == "<p><em>x<br>y</em></p>"


def test_underscores_inside_words_stay_text() -> None:
    assert html("snake_case_name and my_var_ and foo__bar__baz") == (
        "<p>snake_case_name and my_var_ and foo__bar__baz</p>"
    )
    assert html("call get_user_id(user_id) on _this_") == "<p>call get_user_id(user_id) on <em>this</em></p>"
    assert html("https://x.example/a_b_c") == "<p>https://x.example/a_b_c</p>"


def test_emphasis_always_nests() -> None:
    assert html("*a _b* c_") == "<p><em>a _b</em> c_</p>"
    assert html("_a *b_ c*") == "<p><em>a *b</em> c*</p>"


def test_backslash_escapes_ascii_punctuation_but_not_backticks() -> None:
    assert html(r"\*not\* \_em\_ \[x](https://x.example) \# C:\path") == (
        "<p>*not* _em_ [x](https://x.example) # C:\\path</p>"
    )
    assert html(r"\`code`") == "<p>\\<code>code</code></p>"


# ---------------------------------------------------------------- blocks


def test_paragraphs_and_line_breaks() -> None:
    assert html("one\ntwo  \n  three\n\n\nfour") == "<p>one<br>two<br>three</p><p>four</p>"


def test_unordered_and_ordered_lists() -> None:
    assert html("- a\n* b\n+ c") == "<ul><li>a</li><li>b</li><li>c</li></ul>"
    assert html("1. a\n2. b") == "<ol><li>a</li><li>b</li></ol>"
    assert html("3. c\n4. d") == '<ol start="3"><li>c</li><li>d</li></ol>'
    assert html("1. a\n- b") == "<ol><li>a</li></ol><ul><li>b</li></ul>"
    assert html("- **a**: `x`\n-\n- c") == "<ul><li><strong>a</strong>: <code>x</code></li><li></li><li>c</li></ul>"
    assert html("-no space, 1.no space, 1) paren") == "<p>-no space, 1.no space, 1) paren</p>"


def test_lists_nest_by_indentation_keep_blank_separated_items_and_take_lazy_lines() -> None:
    assert html("- a\n  - b\n    - c\n- d") == "<ul><li>a<ul><li>b<ul><li>c</li></ul></li></ul></li><li>d</li></ul>"
    assert html("1. a\n\n2. b\n\n   more\n\n   ```sh\n   ls\n   ```") == (
        '<ol><li>a</li><li>b<p>more</p><pre><code class="language-sh">ls</code></pre></li></ol>'
    )
    assert html("- a\nlazy\n\nafter") == "<ul><li>a<br>lazy</li></ul><p>after</p>"


def test_a_list_interrupts_a_paragraph_only_from_a_bullet_or_1() -> None:
    assert html("Steps:\n- one\n- two") == "<p>Steps:</p><ul><li>one</li><li>two</li></ul>"
    assert html("Steps:\n1. one") == "<p>Steps:</p><ol><li>one</li></ol>"
    assert html("In\n2024. it rained") == "<p>In<br>2024. it rained</p>"


def test_block_quotes() -> None:
    assert html("> a\n> b\nlazy\n\nout") == "<blockquote><p>a<br>b<br>lazy</p></blockquote><p>out</p>"
    assert html(">> deep\n> - item") == (
        "<blockquote><blockquote><p>deep</p></blockquote><ul><li>item</li></ul></blockquote>"
    )
    assert html("> ```\n> <x>\n> ```") == "<blockquote><pre><code>&lt;x&gt;</code></pre></blockquote>"


def test_headings_are_bold_paragraphs() -> None:
    assert html("# One\n## Two ##\n###### Six\n\ntext") == (
        "<p><strong>One</strong></p><p><strong>Two</strong></p><p><strong>Six</strong></p><p>text</p>"
    )
    assert html("para\n# Heading *em*") == "<p>para</p><p><strong>Heading <em>em</em></strong></p>"
    assert html("## C#\n#\n####### seven\n#hashtag") == "<p><strong>C#</strong></p><p>####### seven<br>#hashtag</p>"


def test_nesting_deeper_than_the_limit_stays_text() -> None:
    assert html("> " * (MAX_DEPTH + 2) + "x") == (
        "<blockquote>" * MAX_DEPTH + "<p>&gt; &gt; x</p>" + "</blockquote>" * MAX_DEPTH
    )
    deep = html("- " * (MAX_DEPTH + 1) + "x")
    assert deep == "<ul><li>" * MAX_DEPTH + "- x" + "</li></ul>" * MAX_DEPTH


# ---------------------------------------------------------------- links


def test_http_https_and_mailto_links() -> None:
    assert html("[docs](https://x.example/a_b?q=1&r=2)") == (
        f'<p><a href="https://x.example/a_b?q=1&amp;r=2" {REL}>docs</a></p>'
    )
    assert html("see [**bold** `code`](http://x.example) and [me]( MAILTO:me@x.example )") == (
        f'<p>see <a href="http://x.example" {REL}><strong>bold</strong> <code>code</code></a>'
        f' and <a href="MAILTO:me@x.example" {REL}>me</a></p>'
    )
    assert html("[wiki](https://en.wikipedia.org/wiki/Foo_(bar))") == (
        f'<p><a href="https://en.wikipedia.org/wiki/Foo_(bar)" {REL}>wiki</a></p>'
    )
    assert html("*[a](HTTPS://X.EXAMPLE)*") == f'<p><em><a href="HTTPS://X.EXAMPLE" {REL}>a</a></em></p>'
    assert html("[[[x](https://x.example)") == f'<p>[[<a href="https://x.example" {REL}>x</a></p>'


def test_quotes_in_an_http_url_cannot_break_out_of_the_attribute() -> None:
    assert html('[x](https://a.example/"onmouseover="x)') == (
        f'<p><a href="https://a.example/&#34;onmouseover=&#34;x" {REL}>x</a></p>'
    )
    assert html("[x](https://a.example/'onmouseover='x)") == (
        f'<p><a href="https://a.example/&#39;onmouseover=&#39;x" {REL}>x</a></p>'
    )
    assert html("[x](https://a.example/><script>)") == (
        f'<p><a href="https://a.example/&gt;&lt;script&gt;" {REL}>x</a></p>'
    )


@pytest.mark.parametrize(
    "link",
    [
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x]( javascript:alert(1))",
        "[x](\tjavascript:alert(1) )",
        "[x](data:text/html;base64,PHNjcmlwdD4=)",
        "[x](vbscript:msgbox(1))",
        "[x](/relative/path)",
        "[x](//evil.example)",
        "[x](ftp://x.example)",
        "[x](&#106;avascript:alert(1))",
        "[x](%6Aavascript:alert(1))",
        "[x](https)",
        "[*x*](javascript:alert(1))",
        "[](https://x.example)",
        "[ ](https://x.example)",
    ],
)
def test_any_other_link_stays_text_in_full(link: str) -> None:
    assert html(link) == f"<p>{Markup.escape(link).strip()}</p>"


def test_link_forms_that_are_not_links() -> None:
    assert html("[x] (https://x.example)") == "<p>[x] (https://x.example)</p>"
    assert html('[x](https://x.example "title")') == "<p>[x](https://x.example &#34;title&#34;)</p>"
    assert html("[x](<https://x.example>)") == "<p>[x](&lt;https://x.example&gt;)</p>"
    assert html("[x][ref]\n\n[ref]: https://x.example") == "<p>[x][ref]</p><p>[ref]: https://x.example</p>"
    assert html("[a [b](https://x.example)") == f'<p>[a <a href="https://x.example" {REL}>b</a></p>'
    assert html("https://bare.example and <https://auto.example>") == (
        "<p>https://bare.example and &lt;https://auto.example&gt;</p>"
    )
    assert html("[x](https://x.example/" + "a" * 3000 + ")").startswith("<p>[x](https://x.example/aaa")


# ---------------------------------------------------------------- other syntax stays text


def test_images_stay_text() -> None:
    assert html("![a](https://x/y.png)") == "<p>![a](https://x/y.png)</p>"
    assert html("![*a*](javascript:alert(1)) ok") == "<p>![*a*](javascript:alert(1)) ok</p>"


def test_tables_rules_setext_headings_and_strikethrough_stay_text() -> None:
    assert html("| a | b |\n|---|---|\n| 1 | 2 |") == "<p>| a | b |<br>|---|---|<br>| 1 | 2 |</p>"
    assert html("---\n***\n___") == "<p>---<br>***<br>___</p>"
    assert html("Title\n=====") == "<p>Title<br>=====</p>"
    assert html("~~gone~~ <del>x</del>") == "<p>~~gone~~ &lt;del&gt;x&lt;/del&gt;</p>"


# ---------------------------------------------------------------- adversarial inputs

ADVERSARIAL = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "<svg/onload=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "<<script>>alert(1)<</script>>",
    "<scr\x00ipt>alert(1)</scr\x00ipt>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x]( javascript:alert(1))",
    "[x](java\nscript:alert(1))",
    "[x](\njavascript:alert(1))",
    '[x](https://a.example/"onmouseover="x)',
    "[x](https://a.example/'onmouseover='x)",
    '[x](https://a.example/" onmouseover="x")',
    "[x](https://a.example/><img src=x onerror=alert(1)>)",
    "[<img src=x onerror=alert(1)>](https://a.example)",
    '[x](https://a.example)" onmouseover="y',
    "[x](javascript:[y](https://a.example))",
    "[x](https://a.example/(javascript:alert(1)))",
    "![a](https://x/y.png)",
    "![a](javascript:alert(1))",
    "| a | b |\n|---|---|\n| <b>1</b> | 2 |",
    "```<script>\nalert(1)\n```",
    '```" onclick="alert(1)\nx\n```',
    "```python\n</code></pre><script>alert(1)</script>",
    "`</code><script>alert(1)</script>`",
    "**<b>bold</b>** _<i>it</i>_",
    "> <script>alert(1)</script>\n- <script>\n1. <script>\n# <script>",
    "*a _b [c](https://x.example) d* e_",
    "***a** b* _c __d_ e__",
    "&lt;script&gt; &#60;script&#62; &#x3C;",
    "\\<script> \\[x](javascript:alert(1))",
    "- a\n  > b\n  > ```\n  > <c>\n- [d](javascript:x)",
    "\n".join("   " * depth + f"1. item {depth}" for depth in range(12)),
    "> " * 40 + "[x](https://x.example) *y*",
    "- " * 40 + "**z**",
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_inputs_give_only_allowed_markup(text: str) -> None:
    out = str(render(text))
    assert_safe(out)
    assert "<script" not in out and "<img" not in out and "<svg" not in out


def test_random_markdown_soup_gives_only_allowed_markup() -> None:
    pieces = ["*", "**", "_", "__", "`", "```", "[", "]", "(", ")", "![", "\\", "<", ">", '"', "'", "&", "#", "- "]
    pieces += ["1. ", "> ", "\n", "\n\n", "  ", "a", "b_c", "https://x.example", "javascript:", "mailto:m@x", "é"]
    rng = random.Random(613)
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        assert_safe(str(render(text)))


# ---------------------------------------------------------------- large inputs: no catastrophic backtracking

N = 1_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("*" * N, "<p>" + "*" * N + "</p>"),
        ("_" * N, "<p>" + "_" * N + "</p>"),
        ("[" * N, "<p>" + "[" * N + "</p>"),
        ("]" * N, "<p>" + "]" * N + "</p>"),
        ("(" * N, "<p>" + "(" * N + "</p>"),
        ("#" * N, "<p>" + "#" * N + "</p>"),
        ("<" * N, "<p>" + "&lt;" * N + "</p>"),
        ("`" * N, "<pre><code></code></pre>"),  # one line of backticks opens a fence that never closes
        ("\n" * N, ""),
        ("x" * N, "<p>" + "x" * N + "</p>"),
        ("[a](" + "(" * N, "<p>[a](" + "(" * N + "</p>"),
    ],
    ids=["stars", "underscores", "open-brackets", "close-brackets", "parens", "hashes", "lt", "backticks", "newlines",
         "letters", "link-target-of-parens"],
)  # fmt: skip
def test_a_million_characters_of_one_kind(text: str, expected: str) -> None:
    assert str(render(text)) == expected


@pytest.mark.parametrize(
    "unit",
    ["*a", "_a ", "**a", "*_", "` ", "[a](", "[a](x", "[]", "![", "\\", "[a", "- ", "1. ", "> ", ">", "- a\n",
     "> - ", "[a](x(", "*a **b ", "```\n", "[x](https://x.example)"],
)  # fmt: skip
def test_long_repetitive_inputs_render(unit: str) -> None:
    text = unit * (50_000 // len(unit))
    out = str(render(text))
    assert out
    assert_safe(out)
