"""Text -> frozen AST, with lark's errors turned into located diagnostics.

Recovery: after a syntax error, the top-level item that holds it (from its first line to
the start of the next item: a line beginning with `problem`, `train`, `A -> B`, ...) is
blanked out, keeping every offset, and the file is parsed again, so each broken item gets
its own diagnostic in one run. When any item is broken, the later stages do not run: a
half-read program would only produce follow-on noise.
"""

from __future__ import annotations

import ast as pyast
import re

import lark
from lark import Token, Transformer, v_args

from mloc.diagnostics import Diagnostic, DiagnosticError
from mloc.frontend import ast
from mloc.frontend.bounds import STRING_OR_COMMENT as _STRING_OR_COMMENT
from mloc.frontend.bounds import integer, too_deep
from mloc.frontend.grammar import parser
from mloc.source import SourceFile, Span

# What the user sees for each terminal lark says it expected.
_TERMINALS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string",
    "LBRACE": "`{`", "RBRACE": "`}`", "LPAR": "`(`", "RPAR": "`)`", "LSQB": "`[`", "RSQB": "`]`",
    "COMMA": "`,`", "SEMICOLON": "`;`", "EQUAL": "`=`", "DOT": "`.`", "__ANON_0": "`->`",
    "PROGRAM": "`program`", "IMPORT": "`import`", "AS": "`as`", "PROBLEM": "`problem`",
    "CHAIN": "`chain`", "TRAIN": "`train`", "EVERY": "`every`",
}
_KEYWORDS = {"program", "import", "as", "problem", "chain", "train", "every", "true", "false",
             "True", "False"}


def _describe(term: str) -> str:
    if term in _TERMINALS:
        return _TERMINALS[term]
    if term.startswith("__ANON"):
        return "`->`"
    return term.lower()


def _expected(names) -> str:
    items = sorted({_describe(n) for n in names})
    if len(items) > 6:
        items = items[:6] + ["..."]
    return ", ".join(items)


def _token_text(tok: Token) -> str:
    return "end of file" if tok.type == "$END" else f"`{tok}`"


def _syntax_error(src: SourceFile, err: lark.exceptions.LarkError) -> Diagnostic:
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        start = err.pos_in_stream
        ch = src.text[start]
        if ch in "\"'":
            return Diagnostic("E003", "this string is never closed", src.span(start, start + 1),
                              label="string starts here",
                              help=f"add the closing {ch} on the same line")
        help = "remove it; names use letters, digits and `_`"
        if ch == ">" and src.text[start - 1:start] == "=":
            help = "hierarchy edges are written `upper -> lower`"
        elif ch == ":" and re.search(r"[A-Za-z_]\w*[ \t]*$", src.text[:start]):
            key = re.search(r"([A-Za-z_]\w*)[ \t]*$", src.text[:start]).group(1)
            return Diagnostic("E002", "unexpected character `:`", src.span(start, start + 1),
                              label="expected `=`", help=f"fields are set with `=`: write `{key} = ...`")
        return Diagnostic("E002", f"unexpected character `{ch}`", src.span(start, start + 1), help=help)
    if isinstance(err, lark.exceptions.UnexpectedEOF) or (
            isinstance(err, lark.exceptions.UnexpectedToken) and err.token.type == "$END"):
        end = _last_code_offset(src.text)
        span = src.span(max(0, end - 1), max(end, 1))
        opened = _unclosed(src.text)
        if opened is None:
            return Diagnostic("E004", "the file ends in the middle of a construct", span,
                              label=f"expected {_expected(err.expected)} after this")
        ch, at = opened
        line, col = src.line_col(at)
        return Diagnostic("E004", f"the file ends before the `{ch}` at {line}:{col} is closed", span,
                          label="the file ends here",
                          help=f"add the matching `{_CLOSER[ch]}`")
    tok = err.token
    if set(err.expected) <= {"EVERY", "ON"}:          # `key name(...)`: a field without its `=`
        return _without_equals(src, tok)
    missing = _missing_brace(src, tok)
    if missing is not None:
        return missing
    span = src.span(tok.start_pos, tok.end_pos)
    help = None
    if tok.type == "NAME" and "EQUAL" in err.expected:
        help = "write fields as `name = value`"
    elif str(tok) in _KEYWORDS:
        help = f"`{tok}` is a keyword and cannot be used as a name here"
    return Diagnostic("E001", f"unexpected {_token_text(tok)}", span,
                      label=f"expected {_expected(err.expected)}", help=help)


_CLOSER = {"{": "}", "(": ")", "[": "]"}


def _without_equals(src: SourceFile, tok: Token) -> Diagnostic:
    """`optimizer sgd(lr=0.1)`: two names in a row start only `eval NAME every` or
    `checkpoint best on`, so the error is the second name, where `=` was meant."""
    m = re.search(r"([A-Za-z_]\w*)[ \t]*([A-Za-z_]\w*)\s*$", src.text[:tok.start_pos])
    if m is None:
        span = src.span(tok.start_pos, tok.end_pos)
        return Diagnostic("E001", f"unexpected {_token_text(tok)}", span, label="expected `every` or `on`")
    return Diagnostic("E001", f"unexpected `{m.group(2)}`", src.span(m.start(2), m.end(2)), label="expected `=`",
                      help=f"write fields as `name = value`: `{m.group(1)} = {m.group(2)}...`")


def _missing_brace(src: SourceFile, tok: Token) -> Diagnostic | None:
    """A top-level item (`problem`, `train`, `A -> B`, ...) that starts a line while a `{`
    is still open: the block before it lacks its `}`. Reported at the opening brace, with
    where the parser stopped."""
    line_start = src.text.rfind("\n", 0, tok.start_pos) + 1
    if src.text[line_start:tok.start_pos].strip() or not _ITEM_START.match(src.text, line_start):
        return None
    opened = _unclosed(src.text[:tok.start_pos])
    if opened is None or opened[0] != "{":
        return None
    at = opened[1]
    line, col = src.line_col(tok.start_pos)
    return Diagnostic("E001", f"a `}}` is missing: this block is still open where `{tok}` starts a new item "
                      f"at {line}:{col}", src.span(at, at + 1), label="this `{` is never closed",
                      help=f"add `}}` after the block's last field, before line {line}",
                      notes=(f"the parser stopped at {src.path}:{line}:{col}, at `{tok}`",))


def _unclosed(text: str) -> tuple[str, int] | None:
    """The innermost bracket still open at the end of the text (strings and comments skipped)."""
    stack: list[tuple[str, int]] = []
    code = _STRING_OR_COMMENT.sub(lambda m: " " * len(m.group(0)), text)
    for i, ch in enumerate(code):
        if ch in _CLOSER:
            stack.append((ch, i))
        elif ch in ")]}" and stack and _CLOSER[stack[-1][0]] == ch:
            stack.pop()
    return stack[-1] if stack else None


def _last_code_offset(text: str) -> int:
    """Offset just past the last character that is neither blank nor in a comment."""
    offset = len(text)
    for line in reversed(text.splitlines(keepends=True)):
        offset -= len(line)
        code = line.split("#", 1)[0].rstrip()
        if code:
            return offset + len(code)
    return 0


_ITEM_START = re.compile(r"^(?:program|import|problem|chain|train)\b|^[A-Za-z_]\w*[ \t]*(?:->|=)", re.M)
MAX_SYNTAX_ERRORS = 20


def _error_offset(src: SourceFile, err: lark.exceptions.UnexpectedInput) -> int:
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        return err.pos_in_stream
    tok = getattr(err, "token", None)
    if tok is None or tok.type == "$END":
        return len(src.text)
    return tok.start_pos


def _blank_item(text: str, offset: int) -> str:
    """Replace the top-level item holding `offset` by spaces, keeping newlines."""
    starts = [m.start() for m in _ITEM_START.finditer(text)]
    begin = max((s for s in starts if s < offset), default=0)
    end = min((s for s in starts if s >= offset and s > begin), default=len(text))
    return text[:begin] + re.sub(r"[^\n]", " ", text[begin:end]) + text[end:]


# Characters that text pasted from papers and chat brings along, with what was meant.
_CONFUSABLES = {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2192": "->", "\u21d2": "->",
                "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u00a0": "a plain space",
                "\u00d7": "*", "\uff1d": "="}


def _foreign_characters(src: SourceFile) -> list[Diagnostic]:
    """Non-ASCII characters outside strings and comments: each is an error on its own."""
    out, pos = [], 0
    for m in [*_STRING_OR_COMMENT.finditer(src.text), None]:
        end = m.start() if m else len(src.text)
        for i in range(pos, end):
            ch = src.text[i]
            if ord(ch) > 127:
                meant = _CONFUSABLES.get(ch)
                out.append(Diagnostic("E002", f"unexpected character `{ch}` (U+{ord(ch):04X})",
                                      src.span(i, i + 1),
                                      help=f"did you mean {meant if ' ' in meant else f'`{meant}`'}?"
                                      if meant else "mloc programs are ASCII outside strings and comments"))
        pos = m.end() if m else end
    return out


_KEYWORD_PROBLEM = re.compile(r"^[ \t]*problem[ \t]+(%s)\b" % "|".join(sorted(_KEYWORDS)), re.M)


def _keyword_problems(src: SourceFile) -> list[Diagnostic]:
    """`problem train { ... }` parses, but every later use of `train` cannot: say why once."""
    return [Diagnostic("E107", f"`{m.group(1)}` is reserved and cannot name a problem",
                       src.span(m.start(1), m.end(1)), help="choose another name")
            for m in _KEYWORD_PROBLEM.finditer(src.text)]


def _follows_misused_keyword(text: str, err, misused: set[str]) -> bool:
    tok = getattr(err, "token", None)
    if not misused or tok is None or tok.type == "$END":
        return False
    before = re.search(r"([A-Za-z_]\w*)\s*$", text[:tok.start_pos])
    return str(tok) in misused or (before is not None and before.group(1) in misused)


def parse(src: SourceFile) -> ast.Module:
    """Parse one file; raises DiagnosticError with every syntax error found (see recovery)."""
    foreign = _foreign_characters(src)
    if foreign:
        raise DiagnosticError(foreign)
    deep = too_deep(src)                # before lark: the tree of such a text is too deep to walk
    if deep is not None:
        raise DiagnosticError([deep])
    keyword_problems = _keyword_problems(src)
    misused = {d.span.text for d in keyword_problems}
    text, errors = src.text, []
    while len(errors) < MAX_SYNTAX_ERRORS:
        try:
            tree = parser().parse(text)
        except lark.exceptions.UnexpectedInput as err:
            if not _follows_misused_keyword(text, err, misused):
                errors.append(_syntax_error(src, err))
            elif not errors:
                errors.extend(keyword_problems)
            blanked = _blank_item(text, _error_offset(src, err))
            if blanked == text:
                break
            text = blanked
            continue
        if not errors:
            return _ToAst(src).build(tree)
        break
    if keyword_problems and not set(keyword_problems) <= set(errors):
        errors.extend(keyword_problems)
    raise DiagnosticError(errors)


class _ToAst(Transformer):
    """lark parse tree -> frozen AST nodes (spans from token and meta positions)."""

    def __init__(self, src: SourceFile):
        super().__init__()
        self.src = src
        self.errors: list[Diagnostic] = []     # integer literals beyond 64 bits (E006)

    def build(self, tree) -> ast.Module:
        module = self.transform(tree)
        if self.errors:
            raise DiagnosticError(self.errors)
        return module

    def _span(self, meta) -> Span:
        return self.src.span(meta.start_pos, meta.end_pos)

    def _tok(self, tok: Token) -> Span:
        return self.src.span(tok.start_pos, tok.end_pos)

    def _ident(self, tok: Token) -> ast.Ident:
        return ast.Ident(str(tok), self._tok(tok))

    @v_args(meta=True)
    def start(self, meta, items):
        span = self.src.span(0, len(self.src.text))
        return ast.Module(tuple(items), span)

    @v_args(meta=True)
    def program_decl(self, meta, c):
        return ast.ProgramDecl(self._ident(c[0]), self._span(meta))

    @v_args(meta=True)
    def import_decl(self, meta, c):
        alias = self._ident(c[1]) if len(c) > 1 and c[1] is not None else None
        return ast.Import(c[0], alias, self._span(meta))

    @v_args(meta=True)
    def problem(self, meta, c):
        return ast.Problem(self._ident(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def edge(self, meta, c):
        body = c[-1] if isinstance(c[-1], ast.Block) else None
        names = [x for x in c if isinstance(x, Token)]
        return ast.Edge(tuple(self._ident(t) for t in names), body, self._span(meta))

    @v_args(meta=True)
    def chain(self, meta, c):
        body = c[-1] if isinstance(c[-1], ast.Block) else None
        names = [x for x in c if isinstance(x, Token)]
        return ast.Chain(tuple(self._ident(t) for t in names), body, self._span(meta))

    @v_args(meta=True)
    def train(self, meta, c):
        return ast.Train(c[0], self._span(meta))

    @v_args(meta=True)
    def setting(self, meta, c):
        return ast.Setting(self._ident(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def block(self, meta, c):
        return ast.Block(tuple(c), self._span(meta))

    @v_args(meta=True)
    def field(self, meta, c):
        return ast.Field(self._ident(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def every(self, meta, c):
        name = self._ident(c[1]) if isinstance(c[1], Token) else None
        c = [c[0], *c[2:]] if name else c
        value = c[2] if len(c) > 2 else None
        return ast.Every(self._ident(c[0]), c[1], value, self._span(meta), name)

    @v_args(meta=True)
    def watch(self, meta, c):
        mode = c[2] if isinstance(c[2], ast.Ident) else None
        return ast.Watch(self._ident(c[0]), self._ident(c[1]), mode, c[-1], self._span(meta))

    @v_args(meta=True)
    def stop(self, meta, c):
        mode = c[1] if isinstance(c[1], ast.Ident) else None
        rest = c[2:] if mode else c[1:]          # metric, [min_delta], patience, unit
        delta = rest[1] if len(rest) == 4 else None
        return ast.Stop(self._ident(c[0]), mode, rest[0], delta, rest[-2], self._ident(rest[-1]),
                        self._span(meta))

    @v_args(meta=True)
    def max_mode(self, meta, c):
        return ast.Ident("max", self._span(meta))

    @v_args(meta=True)
    def min_mode(self, meta, c):
        return ast.Ident("min", self._span(meta))

    @v_args(meta=True)
    def call(self, meta, c):
        args = tuple(a for a in c[1:] if a is not None)
        return ast.Call(c[0], args, self._span(meta))

    @v_args(meta=True)
    def kwarg(self, meta, c):
        return ast.Arg(self._ident(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def posarg(self, meta, c):
        return ast.Arg(None, c[0], self._span(meta))

    @v_args(meta=True)
    def dotted(self, meta, c):
        return ast.Name(tuple(str(t) for t in c), self._span(meta))

    @v_args(meta=True)
    def number(self, meta, c):
        text = str(c[0])
        plain = text.replace("_", "")
        if any(ch in plain for ch in ".eE"):
            return ast.Number(float(plain), text, self._span(meta))
        value = integer(text, self._span(meta))
        if isinstance(value, Diagnostic):
            self.errors.append(value)
            value = 0
        return ast.Number(value, text, self._span(meta))

    @v_args(meta=True)
    def string(self, meta, c):
        return ast.String(pyast.literal_eval(str(c[0])), self._span(meta))

    @v_args(meta=True)
    def true(self, meta, c):
        return ast.Bool(True, self._span(meta))

    @v_args(meta=True)
    def false(self, meta, c):
        return ast.Bool(False, self._span(meta))

    @v_args(meta=True)
    def list(self, meta, c):
        return ast.ListValue(tuple(x for x in c if x is not None), self._span(meta))

    @v_args(meta=True)
    def tuple(self, meta, c):
        return ast.TupleValue(tuple(c), self._span(meta))
