"""SQL92 property filters: compile a subscription expression once, match messages cheaply.

A consumer that subscribes with ``ExpressionType.SQL92`` selects messages by their properties
(SPEC §6.17): ``a BETWEEN 0 AND 3 AND region IN ('eu', 'us')``. The broker evaluates the
expression for every message it scans, so :func:`compile_sql92` parses the text once (an
LALR grammar run by ``lark``) and turns the tree into nested Python closures: matching a
message is a few function calls and dict lookups, never a tree walk. The client compiles too,
so ``subscribe()`` rejects a typo at once with its position.

The language and its meaning follow Apache RocketMQ's ``filter`` module (a JMS-selector
dialect); the behaviours were learnt from its grammar and tests, the code is RocketQ's own.

| construct                    | example                                                     |
|------------------------------|-------------------------------------------------------------|
| numbers                      | ``123``, ``123L``, ``3.1415``, ``.5``, ``1e3``, ``-7``      |
| strings (``''`` is a quote)  | ``'abc'``, ``'it''s'``                                      |
| booleans, null               | ``TRUE``, ``FALSE``, ``NULL``                               |
| properties (case-sensitive)  | ``a``, ``TAGS``, ``$x``: ASCII ``[A-Za-z_$][A-Za-z0-9_$]*`` |
| comparisons                  | ``> >= < <= = <>``                                          |
| ranges, sets                 | ``a [NOT] BETWEEN 1 AND 5``, ``a [NOT] IN ('x', 'y')``      |
| nulls                        | ``a IS NULL``, ``a IS NOT NULL``                            |
| text                         | ``a [NOT] CONTAINS 'x'``, ``[NOT] STARTSWITH``, ``ENDSWITH`` |
| logic, grouping, comments    | ``NOT``, ``AND``, ``OR``, ``( … )``, ``/* … */``, ``-- …⏎`` |

Keywords are case-insensitive. Precedence, loosest first: OR, AND, NOT, ``= <> IS``,
``< > <= >= BETWEEN IN CONTAINS …``, unary ``+ -``.

**Values.** Every property value is a string. A comparison reads the string as the other
side's type, as RocketMQ does; that is what makes ``putUserProperty("a", "3")`` match
``a BETWEEN 0 AND 3``:

| comparison                         | the property's string is read                           |
|------------------------------------|---------------------------------------------------------|
| ``a = 'x'``, ``a <> 'x'``, ``IN``  | as text                                                 |
| ``a OP 5`` (integer constant)      | as a Java long: ASCII digits with an optional sign      |
| ``a OP 2.5`` (decimal constant)    | as a Java double: ``'3'``, ``' 3.5 '``, ``'1e3'``, ``'NaN'``|
| ``a = TRUE``, ``a = FALSE``        | ``'true'`` in any case is TRUE, anything else FALSE     |
| ``a < b`` (two properties)         | both as doubles (``a = b`` compares the text)           |

(OP is any of ``= <> < <= > >=`` and BETWEEN.) A string that does not read as the number
needed (``a > 5`` with ``a`` = ``'abc'``, or ``'3.5'``: an integer constant asks for an integer)
makes the whole expression fail for that message, which then does not match (RocketMQ logs
an error per message and skips it; RocketQ skips it quietly). Strings, booleans and NULL
cannot be ordered (``a > 'x'`` is a compile error); ``IN`` takes a property and strings.

**NULL.** A missing property is NULL. A comparison, BETWEEN or IN with NULL is *unknown*;
``NOT unknown`` is unknown; ``unknown AND FALSE`` is FALSE, ``unknown OR TRUE`` is TRUE; an
expression that is unknown at the top does not match. ``IS [NOT] NULL`` is never unknown.
``CONTAINS``/``STARTSWITH``/``ENDSWITH`` and their ``NOT`` forms are FALSE for NULL (and for an
empty search string), as in RocketMQ. A property used alone as a condition (``a AND b``) is
unknown when missing and FALSE otherwise: its value is a string, never a boolean.

**Where RocketQ differs from RocketMQ** (each a RocketMQ quirk nobody relies on):
``NOT`` binds looser than comparisons, as in SQL (RocketMQ's parser binds it to the next
operand, so ``NOT a > 5`` is a syntax error there); a NULL on the *right* of ``=``/``<>`` is
unknown like one on the left (RocketMQ answers FALSE, so ``'x' <> a`` matched a message without
``a``), and ``a = b`` with both missing is unknown (RocketMQ: TRUE); ``TRUE = a`` converts ``a``
like ``a = TRUE`` does (RocketMQ fails on it); ``0.0`` is a valid constant; integer constants
are 64-bit whatever their size; ``-5`` is a constant, so ``BETWEEN -1 AND -10`` is refused like
``BETWEEN 10 AND 1``.

**Errors.** :class:`Sql92Error` (a ValueError) carries the 0-based position of the problem:
syntax errors, unterminated strings and comments, type errors found at compile time, an empty
expression, one longer than :data:`EXPRESSION_MAX_CHARS` or nested deeper than
:data:`NESTING_MAX` (a cap that keeps a hostile expression from exhausting the broker's stack
when it is compiled or evaluated). :meth:`Sql92Filter.matches` never raises.
"""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

import lark

EXPRESSION_MAX_CHARS = 4096
"""A longer expression is refused: nothing legitimate needs it, and brokers compile it."""
NESTING_MAX = 64
"""Deepest operator nesting accepted (parentheses, NOT, unary minus, chained comparisons)."""
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
"""Integers are Java longs, as in RocketMQ."""

Props: TypeAlias = Mapping[str, str]
Value: TypeAlias = "bool | int | float | str | None"
Evaluator: TypeAlias = Callable[[Props], Any]
"""A compiled node: returns its value for one message (TRUE/FALSE/None for conditions)."""


class Sql92Error(ValueError):
    """An SQL92 expression that does not compile, with where and why."""

    def __init__(self, expression: str, position: int, reason: str, kind: str = "syntax error"):
        self.expression = expression
        self.position = position
        """0-based character offset of the problem (the end of the text for "ended too soon")."""
        self.reason = reason
        self.kind = kind
        super().__init__(
            f'SQL92 expression "{_excerpt(expression, position)}": {kind} at position '
            f"{position}: {reason}"
        )


def _excerpt(expression: str, position: int, width: int = 160) -> str:
    """The expression for a message; a long one is cut to a window around ``position``."""
    if len(expression) <= width:
        return expression
    start = max(0, min(position - width // 2, len(expression) - width))
    text = expression[start : start + width]
    return ("…" if start else "") + text + ("…" if start + width < len(expression) else "")


# ---- grammar --------------------------------------------------------------------------------
# Rules starting with "?" disappear when they have one child, so "a = 1" is one `equal` node;
# AND/OR chains are flat n-ary nodes (no left-deep tree to recurse through).
_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: NOT not_expr                               -> not_
    | equality
?equality: comparison
    | equality EQ comparison                          -> equal
    | equality NE comparison                          -> not_equal
    | equality IS NULL                                -> is_null
    | equality IS NOT NULL                            -> is_not_null
?comparison: unary
    | comparison order_op unary                       -> order
    | comparison BETWEEN unary _AND unary             -> between
    | comparison NOT BETWEEN unary _AND unary         -> not_between
    | comparison IN _LPAR string_list _RPAR           -> in_
    | comparison NOT IN _LPAR string_list _RPAR       -> not_in
    | comparison text_op STRING                       -> text
    | comparison NOT text_op STRING                   -> not_text
?order_op: GT | GE | LT | LE
?text_op: CONTAINS | STARTSWITH | ENDSWITH
string_list: STRING (_COMMA STRING)*
?unary: PLUS unary                                    -> plus
    | MINUS unary                                     -> neg
    | primary
?primary: DECIMAL                                     -> integer
    | FLOAT                                           -> decimal
    | STRING                                          -> string
    | TRUE                                            -> true
    | FALSE                                           -> false
    | NULL                                            -> null
    | ID                                              -> prop
    | _LPAR or_expr _RPAR

_OR: "or"i
_AND: "and"i
NOT: "not"i
IS: "is"i
NULL: "null"i
TRUE: "true"i
FALSE: "false"i
BETWEEN: "between"i
IN: "in"i
CONTAINS: "contains"i
STARTSWITH: "startswith"i
ENDSWITH: "endswith"i
EQ: "="
NE: "<>"
GT: ">"
GE: ">="
LT: "<"
LE: "<="
PLUS: "+"
MINUS: "-"
_LPAR: "("
_RPAR: ")"
_COMMA: ","
FLOAT.3: /[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
DECIMAL.2: /(?:0|[1-9][0-9]*)[lL]?/
STRING: /'(?:[^']|'')*'/
ID: /[A-Za-z_$][A-Za-z0-9_$]*/

%ignore /[ \t\n\r\f]+/
%ignore /--[^\n\r]*(?:\r\n|\n|\r)/
%ignore /\/\*[\s\S]*?\*\//
"""

_parser: lark.Lark | None = None
_parser_lock = threading.Lock()


def _get_parser() -> lark.Lark:
    """The LALR parser, built on first use (building its tables takes a few tens of ms)."""
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = lark.Lark(_GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True)
        return _parser


# ---- the compiled filter --------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Sql92Filter:
    """A compiled SQL92 expression. Thread-safe and immutable; share it freely."""

    expression: str
    """The text as given."""
    property_names: frozenset[str]
    """Every property the expression reads (the only ones a matcher needs decoded)."""
    _evaluate: Evaluator = field(repr=False)

    def matches(self, properties: Props) -> bool:
        """Whether a message with these properties is selected; never raises.

        Unknown (a NULL involved) and a value that cannot be converted both mean "no match".
        """
        try:
            return self._evaluate(properties) is True
        except Exception:  # a conversion failure, or a Mapping that misbehaves
            return False


def compile_sql92(expression: str) -> Sql92Filter:
    """Compile ``expression``; raises :class:`Sql92Error` with the position of the problem.

    Cached (both results and errors), since brokers see the same few expressions on every
    pull and heartbeat.
    """
    result = _compile_cached(expression)
    if isinstance(result, tuple):
        # A new exception per call: re-raising a cached one would grow its traceback forever.
        raise Sql92Error(*result)
    return result


@lru_cache(maxsize=1024)
def _compile_cached(expression: str) -> Sql92Filter | tuple[str, int, str, str]:
    try:
        return _compile(expression)
    except Sql92Error as exc:
        return (exc.expression, exc.position, exc.reason, exc.kind)


def _compile(expression: str) -> Sql92Filter:
    if len(expression) > EXPRESSION_MAX_CHARS:
        raise Sql92Error(
            expression,
            EXPRESSION_MAX_CHARS,
            f"the expression is {len(expression)} characters; the limit is {EXPRESSION_MAX_CHARS}",
            "expression too long",
        )
    if not expression.strip():
        raise Sql92Error(
            expression, 0, 'the expression is empty; write a condition such as "a > 5"', "empty"
        )
    tree = _parse(expression)
    _check_depth(expression, tree)
    compiler = _Compiler(expression)
    top = compiler.node(tree)
    return Sql92Filter(expression, frozenset(compiler.names), compiler.as_condition(top))


# ---- parsing and its errors -----------------------------------------------------------------
_SHOWN = {"EQ": "'='", "NE": "'<>'", "GT": "'>'", "GE": "'>='", "LT": "'<'", "LE": "'<='"}
_SHOWN |= {"_RPAR": "')'", "_LPAR": "'('", "_COMMA": "','", "STRING": "a 'string'"}
_HINTS = {
    '"': "strings are written in single quotes: 'abc'",
    "!": "'not equal' is written <>",
    "&": "use AND",
    "|": "use OR",
    "[": "lists are written in parentheses: a IN ('x', 'y')",
}


def _parse(expression: str) -> lark.Tree[lark.Token]:
    try:
        return _get_parser().parse(expression)
    except lark.exceptions.UnexpectedCharacters as exc:
        raise _characters_error(expression, exc.pos_in_stream or 0) from None
    except lark.exceptions.UnexpectedToken as exc:
        raise _token_error(expression, exc.token, exc.expected) from None
    except lark.exceptions.UnexpectedEOF as exc:
        raise _token_error(expression, None, set(exc.expected)) from None
    except RecursionError:  # pragma: no cover - the LALR parser is iterative; belt and braces
        raise Sql92Error(expression, 0, "the expression is too complex", "too complex") from None


def _characters_error(expression: str, pos: int) -> Sql92Error:
    ch = expression[pos] if pos < len(expression) else ""
    if ch == "'":
        return Sql92Error(
            expression,
            pos,
            "unterminated string: no closing quote (write a quote inside a string as '')",
        )
    if expression.startswith("/*", pos):
        return Sql92Error(expression, pos, "unterminated comment: no closing */")
    hint = _HINTS.get(ch)
    return Sql92Error(
        expression, pos, f"unexpected character {ch!r}" + (f"; {hint}" if hint else "")
    )


def _token_error(expression: str, token: lark.Token | None, expected: set[str]) -> Sql92Error:
    if token is None or token.type == "$END":
        pos = len(expression.rstrip())
        what = "unexpected end of expression"
    else:
        pos = token.start_pos if token.start_pos is not None else 0
        shown = str(token) if len(token) <= 40 else str(token)[:40] + "…"
        what = f"unexpected {shown!r}"
        if token.type == "_RPAR" and "_RPAR" not in expected:
            return Sql92Error(expression, pos, f"{what}: there is no '(' for it to close")
        if "$END" in expected:
            return Sql92Error(
                expression,
                pos,
                f"{what}: the condition before it is complete; join conditions with AND or OR",
            )
    if "ID" in expected:  # an operand is due
        needs = "a value: a number, a 'string', TRUE, FALSE, NULL, a property name or '('"
    else:
        names = sorted({_SHOWN.get(t, t.lstrip("_")) for t in expected})
        needs = ", ".join(names[:12]) if names else "something else"
    return Sql92Error(expression, pos, f"{what}; expected {needs}")


def _check_depth(expression: str, tree: lark.Tree[lark.Token]) -> None:
    """Refuse trees deeper than NESTING_MAX, iteratively (the tree may be hostile)."""
    stack: list[tuple[lark.Tree[lark.Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > NESTING_MAX:
            pos = getattr(node.meta, "start_pos", 0) if not node.meta.empty else 0
            raise Sql92Error(
                expression,
                pos,
                f"the expression is nested more than {NESTING_MAX} levels deep; simplify it",
                "expression too deep",
            )
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))


# ---- values at match time -------------------------------------------------------------------
class _EvalError(Exception):
    """A string that does not convert to the type a comparison needs: the message is skipped."""


_LONG_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
_JAVA_TRIM = "".join(chr(c) for c in range(33))
"""Java's ``String.trim`` (and ``Double.valueOf``) drops every char up to U+0020."""


def _to_long(text: str) -> int:
    """``text`` read as Java's ``Long.valueOf`` reads it (ASCII digits, optional sign)."""
    if len(text) < 19 and text.isdigit() and text.isascii():
        return int(text)  # the common case, without the regex
    if _LONG_RE.fullmatch(text) is None or len(text.lstrip("+-").lstrip("0")) > 19:
        raise _EvalError
    n = int(text)
    if not LONG_MIN <= n <= LONG_MAX:
        raise _EvalError
    return n


def _to_double(text: str) -> float:
    """``text`` read as Java's ``Double.valueOf`` reads it (decimal forms, NaN, Infinity)."""
    text = text.strip(_JAVA_TRIM)
    if _DOUBLE_RE.fullmatch(text) is None:
        raise _EvalError
    return float(text[:-1] if text[-1] in "fFdD" else text)


def _to_bool(text: str) -> bool:
    """Java's ``Boolean.valueOf``: "true" in any case is TRUE, anything else FALSE."""
    return len(text) == 4 and text.lower() == "true"


def _dcmp(a: float, b: float) -> int:
    """Java's ``Double.compareTo``: -0.0 < 0.0, NaN above everything and equal to itself."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
            return (sa > sb) - (sa < sb)
        return 0
    a_nan, b_nan = a != a, b != b  # noqa: PLR0124 - the NaN test
    return (a_nan > b_nan) - (a_nan < b_nan)


_FROM_STRING: dict[type, Callable[[str], object]] = {
    int: _to_long,
    float: _to_double,
    bool: _to_bool,
}


def _compare(lv: object, rv: object) -> int:
    """Order two non-NULL values, converting a string to the other side's type (RocketMQ's
    rules). Values of kinds that never compare (a boolean and a number) order as "less"."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is str and rt in _FROM_STRING:
            lv = _FROM_STRING[rt](lv)  # type: ignore[arg-type]
        elif rt is str and lt in _FROM_STRING:
            rv = _FROM_STRING[lt](rv)  # type: ignore[arg-type]
        elif not (lt in (int, float) and rt in (int, float)):
            return -1  # boolean against number
    if type(lv) is float or type(rv) is float:
        return _dcmp(float(lv), float(rv))  # type: ignore[arg-type]
    return int((lv > rv) - (lv < rv))  # type: ignore[operator]


_ORDER_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


# ---- tree -> closures -----------------------------------------------------------------------
CONST, PROP, COND, VALUE = "constant", "property", "condition", "value"
_LITERALS: dict[str, Value] = {"true": True, "false": False, "null": None}
_TESTS = {
    "in_": ("in_test", False),
    "not_in": ("in_test", True),
    "text": ("text_test", False),
    "not_text": ("text_test", True),
    "is_null": ("null_test", True),
    "is_not_null": ("null_test", False),
}
"""Tree nodes built by one :class:`_Compiler` method with a flag (negate / want NULL)."""


@dataclass(slots=True)
class _Node:
    """A compiled subexpression: what it is (for compile-time checks) and how to evaluate it."""

    kind: str
    fn: Evaluator
    start: int
    end: int
    value: Value = None
    """For CONST."""
    name: str = ""
    """For PROP."""


def _const_fn(value: Value) -> Evaluator:
    return lambda _p: value


class _Compiler:
    """Turns a parse tree into closures, checking operand types as RocketMQ's parser does."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.names: set[str] = set()

    # -- helpers ---------------------------------------------------------------------------
    def error(self, pos: int, reason: str) -> Sql92Error:
        return Sql92Error(self.expression, pos, reason, "invalid expression")

    def text(self, n: _Node) -> str:
        shown = self.expression[n.start : n.end].strip()
        return shown if len(shown) <= 40 else shown[:40] + "…"

    def node(self, tree: lark.Tree[lark.Token]) -> _Node:
        data = str(tree.data)
        if data in _LITERALS:
            return self._constant(tree, _LITERALS[data])
        if data in _TESTS:  # IN, CONTAINS & co, IS NULL and their negations
            build, flag = _TESTS[data]
            return self.cond(tree, getattr(self, build)(tree, flag))
        handler: Callable[[lark.Tree[lark.Token]], _Node] = getattr(self, "_" + data)
        return handler(tree)

    @staticmethod
    def span(tree: lark.Tree[lark.Token]) -> tuple[int, int]:
        meta = tree.meta
        return (0, 0) if meta.empty else (meta.start_pos, meta.end_pos)

    def cond(self, tree: lark.Tree[lark.Token], fn: Evaluator) -> _Node:
        return _Node(COND, fn, *self.span(tree))

    def as_condition(self, n: _Node) -> Evaluator:
        """``n`` as something AND/OR/NOT can take: conditions, TRUE/FALSE/NULL, properties."""
        if n.kind == COND or (n.kind == CONST and (n.value is None or type(n.value) is bool)):
            return n.fn
        if n.kind == PROP:
            name = n.name

            def cast(p: Props) -> bool | None:
                # A property's value is a string, never a boolean: FALSE unless missing.
                return None if p.get(name) is None else False

            return cast
        raise self.error(
            n.start,
            f"{self.text(n)} is a value, not a condition; compare it with something, "
            f"e.g. a = {self.text(n)}",
        )

    def check_orderable(self, n: _Node, op: str) -> None:
        if n.kind == CONST and (type(n.value) not in (int, float)):
            hint = "; use IS NULL" if n.value is None else "; only numbers can be ordered"
            raise self.error(n.start, f"{self.text(n)} cannot be compared with {op}{hint}")
        if n.kind == COND:
            raise self.error(
                n.start, f"{self.text(n)} is a condition; it cannot be compared with {op}"
            )

    def check_equatable(self, left: _Node, right: _Node, op: str) -> None:
        for n in (left, right):
            if n.kind == CONST and n.value is None:
                fix = "IS NULL" if op == "=" else "IS NOT NULL"
                raise self.error(n.start, f"NULL cannot be compared with {op}; use {fix}")
        if left.kind == CONST and right.kind == CONST:
            lb, rb = type(left.value) is bool, type(right.value) is bool
            if lb != rb:
                raise self.error(
                    left.start, f"{self.text(left)} cannot be compared with {self.text(right)}"
                )

    # -- logic -----------------------------------------------------------------------------
    def _or_expr(self, tree: lark.Tree[lark.Token]) -> _Node:
        fns = tuple(self.as_condition(self.node(c)) for c in _trees(tree))

        def any_true(p: Props) -> bool | None:
            unknown = False
            for fn in fns:
                v = fn(p)
                if v is True:
                    return True
                if v is None:
                    unknown = True
            return None if unknown else False

        return self.cond(tree, any_true)

    def _and_expr(self, tree: lark.Tree[lark.Token]) -> _Node:
        fns = tuple(self.as_condition(self.node(c)) for c in _trees(tree))

        def all_true(p: Props) -> bool | None:
            unknown = False
            for fn in fns:
                v = fn(p)
                if v is False:
                    return False
                if v is None:
                    unknown = True
            return None if unknown else True

        return self.cond(tree, all_true)

    def _not_(self, tree: lark.Tree[lark.Token]) -> _Node:
        (operand,) = _trees(tree)
        return self.cond(tree, _negate_condition(self.as_condition(self.node(operand))))

    # -- equality and nulls ----------------------------------------------------------------
    def _equal(self, tree: lark.Tree[lark.Token]) -> _Node:
        left, right = (self.node(c) for c in _trees(tree))
        self.check_equatable(left, right, "=")
        return self.cond(tree, _equal_fn(left, right))

    def _not_equal(self, tree: lark.Tree[lark.Token]) -> _Node:
        left, right = (self.node(c) for c in _trees(tree))
        self.check_equatable(left, right, "<>")
        return self.cond(tree, _negate_condition(_equal_fn(left, right)))

    def null_test(self, tree: lark.Tree[lark.Token], want_null: bool) -> Evaluator:
        (operand,) = (self.node(c) for c in _trees(tree))
        if operand.kind == PROP:
            name = operand.name
            return lambda p: (p.get(name) is None) is want_null
        fn = operand.fn
        return lambda p: (fn(p) is None) is want_null

    # -- ordering, ranges, sets, text ------------------------------------------------------
    def _order(self, tree: lark.Tree[lark.Token]) -> _Node:
        left, right = (self.node(c) for c in _trees(tree))
        op = str(_tokens(tree)[0])
        self.check_orderable(left, op)
        self.check_orderable(right, op)
        return self.cond(tree, _order_fn(left, right, op))

    def _between(self, tree: lark.Tree[lark.Token]) -> _Node:
        value, low, high = (self.node(c) for c in _trees(tree))
        for n in (value, low, high):
            self.check_orderable(n, "BETWEEN")
        if low.kind == CONST and high.kind == CONST and _compare(high.value, low.value) < 0:
            raise self.error(
                low.start,
                f"BETWEEN {self.text(low)} AND {self.text(high)} selects nothing: the lower "
                "bound comes first",
            )
        fused = _between_fn(value, low, high)
        if fused is not None:
            return self.cond(tree, fused)
        ge, le = _order_fn(value, low, ">="), _order_fn(value, high, "<=")
        return self.cond(tree, _and2(ge, le))

    def _not_between(self, tree: lark.Tree[lark.Token]) -> _Node:
        value, low, high = (self.node(c) for c in _trees(tree))
        for n in (value, low, high):
            self.check_orderable(n, "NOT BETWEEN")
        lt, gt = _order_fn(value, low, "<"), _order_fn(value, high, ">")
        return self.cond(tree, _or2(lt, gt))

    def in_test(self, tree: lark.Tree[lark.Token], negate: bool) -> Evaluator:
        operand_tree, list_tree = _trees(tree)
        operand = self.node(operand_tree)
        if operand.kind != PROP:
            raise self.error(
                operand.start, f"IN needs a property on its left, not {self.text(operand)}"
            )
        name = operand.name
        values = frozenset(_unquote(t) for t in _tokens(list_tree))

        def is_in(p: Props) -> bool | None:
            v = p.get(name)
            return None if v is None else (v in values) is not negate

        return is_in

    def text_test(self, tree: lark.Tree[lark.Token], negate: bool) -> Evaluator:
        (operand_tree,) = _trees(tree)
        fn = self.node(operand_tree).fn
        tokens = _tokens(tree)
        op, search = tokens[-2].type, _unquote(tokens[-1])
        if not search:
            return _const_fn(False)  # RocketMQ: an empty search string never matches
        test: Callable[[str], bool] = {
            "CONTAINS": lambda v: search in v,
            "STARTSWITH": lambda v: v.startswith(search),
            "ENDSWITH": lambda v: v.endswith(search),
        }[op]

        def text_test(p: Props) -> bool:
            v = fn(p)
            # NULL and non-strings are FALSE here, even under NOT (RocketMQ's rule).
            return type(v) is str and test(v) is not negate

        return text_test

    # -- operands --------------------------------------------------------------------------
    def _plus(self, tree: lark.Tree[lark.Token]) -> _Node:
        (operand,) = _trees(tree)
        return self.node(operand)

    def _neg(self, tree: lark.Tree[lark.Token]) -> _Node:
        (operand_tree,) = _trees(tree)
        operand = self.node(operand_tree)
        start, end = self.span(tree)
        if operand.kind == CONST and type(operand.value) in (int, float):
            value = -operand.value  # type: ignore[operator]
            return _Node(CONST, _const_fn(value), start, end, value=value)
        fn = operand.fn

        def negated(p: Props) -> int | float | None:
            v = fn(p)
            return -v if type(v) in (int, float) else None

        return _Node(VALUE, negated, start, end)

    def _constant(self, tree: lark.Tree[lark.Token], value: Value) -> _Node:
        return _Node(CONST, _const_fn(value), *self.span(tree), value=value)

    def _integer(self, tree: lark.Tree[lark.Token]) -> _Node:
        text = str(_tokens(tree)[0]).rstrip("lL")
        value = int(text)
        if value > LONG_MAX:
            raise self.error(
                self.span(tree)[0],
                f"integer {text} does not fit in 64 bits (the largest is {LONG_MAX}); "
                "write it as a decimal, e.g. 1e19",
            )
        return self._constant(tree, value)

    def _decimal(self, tree: lark.Tree[lark.Token]) -> _Node:
        text = str(_tokens(tree)[0])
        value = float(text)
        if math.isinf(value):
            raise self.error(self.span(tree)[0], f"number {text[:40]} is too large for a double")
        return self._constant(tree, value)

    def _string(self, tree: lark.Tree[lark.Token]) -> _Node:
        return self._constant(tree, _unquote(_tokens(tree)[0]))

    def _prop(self, tree: lark.Tree[lark.Token]) -> _Node:
        name = str(_tokens(tree)[0])
        self.names.add(name)
        return _Node(PROP, operator.methodcaller("get", name), *self.span(tree), name=name)


def _trees(tree: lark.Tree[lark.Token]) -> list[lark.Tree[lark.Token]]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _tokens(tree: lark.Tree[lark.Token]) -> list[lark.Token]:
    return [c for c in tree.children if isinstance(c, lark.Token)]


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'")


# ---- closure builders -----------------------------------------------------------------------
def _negate_condition(fn: Evaluator) -> Evaluator:
    def negated(p: Props) -> bool | None:
        v = fn(p)
        return None if v is None else not v

    return negated


def _and2(f: Evaluator, g: Evaluator) -> Evaluator:
    def both(p: Props) -> bool | None:
        a = f(p)
        if a is False:
            return False
        b = g(p)
        if b is False:
            return False
        return None if a is None or b is None else True

    return both


def _or2(f: Evaluator, g: Evaluator) -> Evaluator:
    def either(p: Props) -> bool | None:
        a = f(p)
        if a is True:
            return True
        b = g(p)
        if b is True:
            return True
        return None if a is None or b is None else False

    return either


def _equal_fn(left: _Node, right: _Node) -> Evaluator:
    # The common shape first: a property against a string constant is a plain comparison.
    prop, const = (left, right) if left.kind == PROP else (right, left)
    if prop.kind == PROP and const.kind == CONST and type(const.value) is str:
        name, text = prop.name, const.value
        return lambda p: None if (v := p.get(name)) is None else v == text
    lf, rf = left.fn, right.fn

    def equals(p: Props) -> bool | None:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is type(rv) and type(lv) is not float:
            return bool(lv == rv)
        return _compare(lv, rv) == 0

    return equals


def _order_fn(left: _Node, right: _Node, op: str) -> Evaluator:
    test = _ORDER_TESTS[op]
    if left.kind == PROP and right.kind == CONST:
        name, c = left.name, right.value
        if type(c) is int:
            return lambda p: None if (v := p.get(name)) is None else test(_to_long(v), c)
        return lambda p: None if (v := p.get(name)) is None else test(_dcmp(_to_double(v), c), 0)  # type: ignore[arg-type]
    if left.kind == CONST and right.kind == PROP:
        name, c = right.name, left.value
        if type(c) is int:
            return lambda p: None if (v := p.get(name)) is None else test(c, _to_long(v))
        return lambda p: None if (v := p.get(name)) is None else test(_dcmp(c, _to_double(v)), 0)  # type: ignore[arg-type]
    lf, rf = left.fn, right.fn

    def ordered(p: Props) -> bool | None:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two properties: compared as numbers
            return test(_dcmp(_to_double(lv), _to_double(rv)), 0)
        return test(_compare(lv, rv), 0)

    return ordered


def _between_fn(value: _Node, low: _Node, high: _Node) -> Evaluator | None:
    """``prop BETWEEN c1 AND c2`` with constants of one numeric type, as one closure; else None.

    Same result as ``prop >= c1 AND prop <= c2`` (one conversion instead of two)."""
    if value.kind != PROP or low.kind != CONST or high.kind != CONST:
        return None
    name, lo, hi = value.name, low.value, high.value
    if type(lo) is int and type(hi) is int:
        return lambda p: None if (v := p.get(name)) is None else lo <= _to_long(v) <= hi
    if type(lo) is float and type(hi) is float:

        def in_range(p: Props) -> bool | None:
            v = p.get(name)
            if v is None:
                return None
            x = _to_double(v)
            return _dcmp(x, lo) >= 0 and _dcmp(x, hi) <= 0

        return in_range
    return None


__all__ = ["EXPRESSION_MAX_CHARS", "NESTING_MAX", "Sql92Error", "Sql92Filter", "compile_sql92"]
