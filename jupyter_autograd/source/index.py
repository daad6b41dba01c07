"""The user's source, parsed: every parse of the package's source layer happens here.

A trace's files (`trace.sources`, filename -> lines) are parsed once each, the first time a reader
asks, and their trees shared by every reader (`SourceIndex`); a file's text parsed before is not
parsed again (a training loop builds a trace per step from the same files). A statement's text,
read by naming and the rules, is parsed once too (`parse_statement`). Those trees are shared:
nobody may change them. A fix that rewrites code asks for a tree of its own (`parse_fresh`).
"""
from __future__ import annotations

import ast
import functools
import io
import tokenize
from typing import Dict, Iterator, List, Optional, Tuple

from ..model import Location


@functools.lru_cache(maxsize=64)
def _parse_file(text: str) -> Optional[ast.Module]:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):  # a notebook cell with IPython syntax, a file with a null byte
        return None


@functools.lru_cache(maxsize=8192)
def parse_statement(text: str, mode: str = "exec") -> Optional[ast.AST]:
    """The shared, read-only tree of a statement's (or an expression's) text; None if it does not parse."""
    try:
        return ast.parse(text, mode=mode)
    except (SyntaxError, ValueError):
        return None


def parse_fresh(text: str, mode: str = "exec") -> Optional[ast.AST]:
    """A tree of its own (a fix may rewrite it) of a piece of the user's code; None if it does not parse."""
    try:
        return ast.parse(text, mode=mode)
    except (SyntaxError, ValueError):
        return None


def without_comment(line: str) -> str:
    """The code of a line without its trailing comment (a `#` inside a string stays)."""
    if "#" not in line:
        return line
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return line[:tok.start[1]].rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a line of a multi-line statement: keep it whole
    return line


class SourceFacts:
    """What readers need from a whole source file besides its tree: `spans`, line -> (first, last)
    line of the simple statement written over several lines that holds it (a call wrapped by a
    formatter runs its ops at any of its lines; only the whole of it says what it assigns);
    `classes`, the names the file binds to classes (its `class` statements, capitalised names it
    imports); `modules`, the names it binds to modules."""

    __slots__ = ("spans", "classes", "modules")

    def __init__(self, spans, classes, modules):
        self.spans, self.classes, self.modules = spans, classes, modules

    def is_class(self, callee: str) -> bool:
        """Whether a capitalised callee (`Slot`, `Categorical`, `torch.distributions.Normal`) is a class
        the file defines or imports, or reaches through a module; not a variable (`G(z)`, `self.D(x)`)."""
        root, _, rest = callee.partition(".")
        return callee in self.classes if not rest else root in self.modules


_NO_FACTS = SourceFacts({}, frozenset(), frozenset())
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
             ast.With, ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try), getattr(ast, "Match", ast.If))


@functools.lru_cache(maxsize=64)
def _facts(text: str) -> SourceFacts:
    tree = _parse_file(text)
    if tree is None:
        return _NO_FACTS
    spans: Dict[int, Tuple[int, int]] = {}
    classes, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND) and node.end_lineno > node.lineno:
            for line in range(node.lineno, node.end_lineno + 1):
                spans[line] = (node.lineno, node.end_lineno)
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                bound = a.asname or a.name
                (classes if a.name[:1].isupper() else modules).add(bound)
    return SourceFacts(spans, frozenset(classes), frozenset(modules))


class SourceIndex:
    """The source files of one trace (`trace.sources`, which the build fills as it meets files), their
    trees and facts, and the statements ops ran at."""

    __slots__ = ("sources", "_texts")

    def __init__(self, sources: Dict[str, List[str]]):
        self.sources = sources
        self._texts: Dict[str, str] = {}  # a file's lines as one text, joined once (its hash then computed once)

    def _text(self, filename: str) -> str:
        text = self._texts.get(filename)
        if text is None:
            lines = self.sources.get(filename)
            if not lines:
                return ""
            text = self._texts[filename] = "".join(lines)
        return text

    def tree(self, filename: str) -> Optional[ast.Module]:
        """The file's syntax tree (shared: read only), or None when it does not parse."""
        text = self._text(filename)
        return _parse_file(text) if text else None

    def trees(self, only: Optional[str] = None) -> Iterator[Tuple[str, ast.Module]]:
        """(filename, tree) of each file that parses, or of `only`."""
        for filename in list(self.sources):
            if only is not None and filename != only:
                continue
            tree = self.tree(filename)
            if tree is not None:
                yield filename, tree

    def facts(self, filename: str) -> SourceFacts:
        text = self._text(filename)
        return _facts(text) if text else _NO_FACTS

    def first_line(self, where: Location) -> int:
        """The first line of the statement that holds `where`'s line."""
        span = self.facts(where.filename).spans.get(where.line)
        return where.line if span is None else span[0]

    def text(self, where: Location) -> str:
        """The whole text of the statement that holds `where`'s line (a line that is no part of a
        statement written over several lines stands for itself)."""
        span = self.facts(where.filename).spans.get(where.line)
        if span is None:
            return where.source
        lines = self.sources[where.filename][span[0] - 1:span[1]]
        return "".join(lines).strip()

    def line(self, filename: str, line: int) -> str:
        lines = self.sources.get(filename) or []
        return lines[line - 1].rstrip("\n") if 0 < line <= len(lines) else ""
