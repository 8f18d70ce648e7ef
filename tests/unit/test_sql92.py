"""SQL92 property filters (rocketq/sql92.py): every operator, constant, NULL case and error.

Expected values follow RocketMQ's filter module (learnt from its tests and expression classes)
except where the module docstring lists a deliberate difference; those cases are marked here.
The Hypothesis fuzz at the end checks the two promises the broker relies on: compiling raises
nothing but Sql92Error, and matching raises nothing at all.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq import sql92
from rocketq.sql92 import (
    EXPRESSION_MAX_CHARS,
    NESTING_MAX,
    Sql92Error,
    Sql92Filter,
    compile_sql92,
)

pytestmark = pytest.mark.unit


def match(expression: str, **props: str) -> bool:
    return compile_sql92(expression).matches(props)


# -- constants and comparisons -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "props", "expected"),
    [
        # integers against a string property (the documented use: putUserProperty("a", "3"))
        ("a > 2", {"a": "3"}, True),
        ("a > 3", {"a": "3"}, False),
        ("a >= 3", {"a": "3"}, True),
        ("a < 4", {"a": "3"}, True),
        ("a <= 2", {"a": "3"}, False),
        ("a = 3", {"a": "3"}, True),
        ("a = 3", {"a": "+3"}, True),
        ("a = 3L", {"a": "3"}, True),
        ("a <> 3", {"a": "4"}, True),
        ("a <> 3", {"a": "3"}, False),
        ("3 < a", {"a": "4"}, True),
        ("a > -5", {"a": "-4"}, True),
        ("a < -5", {"a": "-4"}, False),
        ("a = 9223372036854775807", {"a": "9223372036854775807"}, True),
        ("a > 0", {"a": "000000000000000000000001"}, True),
        # decimals
        ("a > 3.14", {"a": "3.1415"}, True),
        ("a > 3.1E10", {"a": "31415000000.0"}, True),
        ("a = 1e3", {"a": "1000"}, True),
        ("a = .5", {"a": "0.5"}, True),
        ("a = 5.", {"a": "5"}, True),
        ("a >= 0.0", {"a": "0"}, True),
        ("a > 2.5", {"a": " 3 "}, True),  # Java's Double.valueOf trims
        ("a > 2.5", {"a": "3f"}, True),  # and takes a float/double suffix
        ("a > 1e300", {"a": "Infinity"}, True),
        ("a > 1e300", {"a": "NaN"}, True),  # Double.compareTo puts NaN above everything
        ("a = 0.0", {"a": "-0.0"}, False),  # ... and -0.0 below 0.0
        ("a = 3", {"a": "3"}, True),
        ("a = 3.0", {"a": "3"}, True),
        ("3 = 3.0", {}, True),
        ("2 < 2.5", {}, True),
        # strings
        ("a = 'abc'", {"a": "abc"}, True),
        ("a = 'abc'", {"a": "ABC"}, False),
        ("'abc' = a", {"a": "abc"}, True),
        ("a <> 'abc'", {"a": "abd"}, True),
        ("a = 'it''s'", {"a": "it's"}, True),
        ("a = ''", {"a": ""}, True),
        ("TAGS = '''''tag'''''", {"TAGS": "''tag''"}, True),
        ("a = '3'", {"a": "3.0"}, False),  # text, not numbers
        # booleans
        ("a = TRUE", {"a": "true"}, True),
        ("a = TRUE", {"a": "TRUE"}, True),
        ("a = TRUE", {"a": "yes"}, False),
        ("a = FALSE", {"a": "false"}, True),
        ("a = FALSE", {"a": "anything"}, True),  # Boolean.valueOf: not "true" is FALSE
        ("TRUE = a", {"a": "true"}, True),  # RocketMQ fails on this order; RocketQ converts
        ("TRUE", {}, True),
        ("FALSE", {}, False),
        ("TRUE = TRUE", {}, True),
        ("(a > 1) = TRUE", {"a": "2"}, True),
        ("(a > 1) = FALSE", {"a": "2"}, False),
        ("(a > 1) = 1", {"a": "2"}, False),  # a boolean never equals a number
        ("(a > 1) <> 1", {"a": "2"}, True),
        # two properties: = compares text, < > compare numbers
        ("a = b", {"a": "3.14", "b": "3.14"}, True),
        ("a <> b", {"a": "3.14", "b": "3.141"}, True),
        ("a = b", {"a": "3", "b": "3.0"}, False),
        ("a > b", {"a": "10", "b": "9"}, True),
        ("a > b", {"a": "10", "b": "20"}, False),
        ("a < b", {"a": "1e2", "b": "101"}, True),
        # unary + and -
        ("+a = 3", {"a": "3"}, True),
        ("a = - -3", {"a": "3"}, True),
        ("-a < 0", {"a": "3"}, False),  # -(string) is NULL, so unknown
        ("a = +3", {"a": "3"}, True),
    ],
)
def test_comparisons(expression: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expression).matches(props) is expected


@pytest.mark.parametrize(
    ("expression", "props", "expected"),
    [
        ("a BETWEEN 0 AND 3", {"a": "3"}, True),
        ("a BETWEEN 0 AND 3", {"a": "0"}, True),
        ("a BETWEEN 0 AND 3", {"a": "4"}, False),
        ("a BETWEEN 0 AND 3", {"a": "-1"}, False),
        ("a between 0.5 and 1.5", {"a": "1"}, True),
        ("a BETWEEN 0 AND 1.5", {"a": "1"}, True),
        ("a BETWEEN -3 AND -1", {"a": "-2"}, True),
        ("a BETWEEN 5 AND 5", {"a": "5"}, True),
        ("a NOT BETWEEN 0 AND 3", {"a": "4"}, True),
        ("a NOT BETWEEN 0 AND 3", {"a": "2"}, False),
        ("a BETWEEN b AND c", {"a": "2", "b": "1", "c": "3"}, True),
        ("a BETWEEN 1 AND 3 AND b = 'x'", {"a": "2", "b": "x"}, True),
        ("a IN ('x', 'y')", {"a": "y"}, True),
        ("a IN ('x', 'y')", {"a": "z"}, False),
        ("a in ('x')", {"a": "x"}, True),
        ("a IN ('1', '2', '3', '4', '5', '6')", {"a": "6"}, True),
        ("a NOT IN ('x', 'y')", {"a": "z"}, True),
        ("a NOT IN ('x', 'y')", {"a": "x"}, False),
        ("a IN ('3')", {"a": "3.0"}, False),
        ("a IS NULL", {}, True),
        ("a IS NULL", {"a": ""}, False),
        ("a IS NOT NULL", {"a": ""}, True),
        ("a IS NOT NULL", {}, False),
        ("(a > 1) IS NULL", {}, True),
        ("5 IS NULL", {}, False),
        ("NULL IS NULL", {}, True),
        ("a CONTAINS 'b'", {"a": "abc"}, True),
        ("a CONTAINS 'x'", {"a": "abc"}, False),
        ("a NOT CONTAINS 'x'", {"a": "abc"}, True),
        ("a STARTSWITH 'ab'", {"a": "abc"}, True),
        ("a NOT STARTSWITH 'ab'", {"a": "abc"}, False),
        ("a ENDSWITH 'bc'", {"a": "abc"}, True),
        ("a NOT ENDSWITH 'x'", {"a": "abc"}, True),
        ("a CONTAINS ''", {"a": "abc"}, False),  # an empty search string never matches
        ("a NOT CONTAINS ''", {"a": "abc"}, False),
        ("a CONTAINS ' '", {"a": "a c"}, True),
        ("'axb' CONTAINS 'x'", {}, True),
        ("5 CONTAINS '5'", {}, False),  # not a string
        (
            "a=3 AND b CONTAINS 'xxx' AND c NOT CONTAINS 'xxx'",
            {"a": "3", "b": "1xxx", "c": "y"},
            True,
        ),
    ],
)
def test_ranges_sets_nulls_and_text(expression: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expression).matches(props) is expected


@pytest.mark.parametrize(
    ("expression", "props", "expected"),
    [
        ("a = 1 AND b = 2", {"a": "1", "b": "2"}, True),
        ("a = 1 AND b = 2", {"a": "1", "b": "3"}, False),
        ("a = 1 OR b = 2", {"a": "0", "b": "2"}, True),
        ("a = 1 OR b = 2", {"a": "0", "b": "0"}, False),
        ("NOT a = 1", {"a": "2"}, True),  # SQL precedence: NOT (a = 1)
        ("NOT a > 5", {"a": "3"}, True),
        ("NOT (a > 5)", {"a": "6"}, False),
        ("NOT NOT a > 5", {"a": "6"}, True),
        ("a = 1 OR b = 2 AND c = 3", {"a": "1"}, True),  # AND binds tighter than OR
        ("(a = 1 OR b = 2) AND c = 3", {"a": "1"}, False),
        ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "1"}, True),
        ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "10"}, False),
        ("(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))", {"a": "5", "b": "3"}, True),
        ("a not in ('4', '4', '5') and b between 3 and 10", {"a": "3", "b": "3"}, True),
        ("a = 1 -- a comment\n AND b = 2", {"a": "1", "b": "2"}, True),
        ("a = 1 /* b = 2 AND */ OR b = 3", {"a": "0", "b": "3"}, True),
        ("A = 1", {"a": "1"}, False),  # property names are case-sensitive
        ("orange = 1 OR android = 2", {"orange": "1"}, True),  # keyword prefixes are names
        ("$x = 1 AND _y = 2", {"$x": "1", "_y": "2"}, True),
        ("a", {"a": "true"}, False),  # a property alone is never TRUE (its value is a string)
        ("NOT a", {"a": "x"}, True),
    ],
)
def test_logic(expression: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expression).matches(props) is expected


# -- NULL: a missing property --------------------------------------------------------------------
UNKNOWN_WHEN_A_MISSING = [
    "a > 1",
    "a >= 1",
    "a < 1",
    "a <= 1",
    "a = 1",
    "a <> 1",
    "a = 'x'",
    "a <> 'x'",
    "'x' = a",
    "'x' <> a",  # RocketMQ answers TRUE here (NULL on the right of <>); RocketQ: unknown
    "a = TRUE",
    "a = b",  # both missing: RocketMQ TRUE; RocketQ unknown
    "a BETWEEN 1 AND 2",
    "a NOT BETWEEN 1 AND 2",
    "a IN ('x')",
    "a NOT IN ('x')",
    "a > b",
    "-a = 1",
    "a",
]


@pytest.mark.parametrize("expression", UNKNOWN_WHEN_A_MISSING)
def test_missing_property_is_unknown_under_every_operator(expression: str) -> None:
    f = compile_sql92(expression)
    assert not f.matches({})
    assert not f.matches({"b": "1"})
    # unknown stays unknown under NOT, and is absorbed only by FALSE AND / TRUE OR
    assert not compile_sql92(f"NOT ({expression})").matches({})
    assert not compile_sql92(f"({expression}) AND TRUE").matches({})
    assert not compile_sql92(f"({expression}) OR FALSE").matches({})
    assert compile_sql92(f"({expression}) OR TRUE").matches({})
    assert compile_sql92(f"NOT (({expression}) AND FALSE)").matches({})
    assert compile_sql92(f"({expression}) IS NULL").matches({})


@pytest.mark.parametrize(
    "expression",
    ["a CONTAINS 'x'", "a NOT CONTAINS 'x'", "a STARTSWITH 'x'", "a NOT ENDSWITH 'x'"],
)
def test_text_operators_are_false_not_unknown_for_null(expression: str) -> None:
    assert not compile_sql92(expression).matches({})
    assert compile_sql92(f"NOT ({expression})").matches({})  # FALSE, so NOT gives TRUE


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("NULL", False),
        ("NOT NULL", False),
        ("NULL AND FALSE", False),
        ("NOT (NULL AND FALSE)", True),
        ("NULL AND TRUE", False),
        ("NOT (NULL AND TRUE)", False),
        ("NULL OR TRUE", True),
        ("NULL OR FALSE", False),
        ("NOT (NULL OR FALSE)", False),
        ("FALSE AND NULL", False),
        ("TRUE OR NULL", True),
        ("NULL IS NOT NULL", False),
    ],
)
def test_three_valued_logic(expression: str, expected: bool) -> None:
    assert compile_sql92(expression).matches({}) is expected


def test_is_null_and_is_not_null_are_never_unknown() -> None:
    assert match("NOT (a IS NULL)", a="1")
    assert match("NOT (a IS NOT NULL)")


# -- values that do not convert: the message does not match --------------------------------------
@pytest.mark.parametrize(
    ("expression", "props"),
    [
        ("a > 5", {"a": "abc"}),
        ("a > 5", {"a": "6.5"}),  # an integer constant asks for an integer
        ("a > 5", {"a": " 6"}),  # Long.valueOf does not trim
        ("a > 5", {"a": "99999999999999999999"}),  # beyond a long
        ("a > 5", {"a": "٦"}),  # not ASCII digits
        ("a > 5", {"a": "1_0"}),
        ("a > 5", {"a": ""}),
        ("a > 5.0", {"a": "abc"}),
        ("a > 5.0", {"a": "inf"}),
        ("a > 5.0", {"a": "0x10"}),
        ("a = 5", {"a": "five"}),
        ("a BETWEEN 0 AND 3", {"a": "x"}),
        ("a > b", {"a": "1", "b": "x"}),
        ("a > 5", {"a": "9" * 5000}),  # beyond Python's int-from-str digit limit too
        ("'x' = 1", {}),
    ],
)
def test_unconvertible_values_do_not_match(expression: str, props: dict[str, str]) -> None:
    f = compile_sql92(expression)
    assert f.matches(props) is False
    assert compile_sql92(f"NOT ({expression})").matches(props) is False


def test_a_conversion_failure_fails_the_whole_expression_as_in_rocketmq() -> None:
    # RocketMQ evaluates left to right and gives up on the first value that does not convert.
    assert not match("a > 5 OR b = 'x'", a="abc", b="x")
    assert match("b = 'x' OR a > 5", a="abc", b="x")
    assert match("NOT (a = 1 AND b > 5)", a="2", b="abc")  # FALSE first: b is never read


def test_matches_never_raises_on_odd_mappings() -> None:
    f = compile_sql92("a > 5 AND b IN ('x') AND c CONTAINS 'y'")
    assert f.matches({"a": 6, "b": ["unhashable"], "c": None}) is False  # type: ignore[dict-item]

    class Broken(dict[str, str]):
        def get(self, key: str, default: object = None) -> str:
            raise RuntimeError("boom")

    assert f.matches(Broken()) is False


# -- the compiled object ----------------------------------------------------------------------
def test_filter_exposes_expression_and_property_names() -> None:
    f = compile_sql92("a > 1 AND (b IS NULL OR c IN ('x')) AND d BETWEEN e AND 5")
    assert isinstance(f, Sql92Filter)
    assert f.expression == "a > 1 AND (b IS NULL OR c IN ('x')) AND d BETWEEN e AND 5"
    assert f.property_names == frozenset("abcde")
    assert compile_sql92("TRUE").property_names == frozenset()


def test_compile_is_cached_for_results_and_errors() -> None:
    assert compile_sql92("x = 1") is compile_sql92("x = 1")
    with pytest.raises(Sql92Error) as first:
        compile_sql92("x >> 1")
    with pytest.raises(Sql92Error) as second:
        compile_sql92("x >> 1")
    # the same error each time, but a fresh exception (a re-raised one would grow its traceback)
    assert str(first.value) == str(second.value)
    assert first.value is not second.value


def test_keywords_are_case_insensitive() -> None:
    assert match("a Between 1 aNd 3 oR b iS nOt NuLl AnD c In ('x') aND NoT tRuE", a="2")
    assert match("a = 1 AND b Contains 'x' AND c StartsWith 'y' AND d ENDSWITH 'z'",
                 a="1", b="x", c="y", d="z")  # fmt: skip


# -- compile errors, with their positions --------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "position", "fragment"),
    [
        ("a >> 5", 3, "unexpected '>'"),
        ("", 0, "empty"),
        ("   ", 0, "empty"),
        ("a = 'abc", 4, "unterminated string"),
        ("a = 'it''s", 8, "unterminated string"),  # 'it' is a string; the 2nd quote opens one
        ("a = 1 /* x", 6, "unterminated comment"),
        ("a = 1 b", 6, "join conditions with AND or OR"),
        ("a = 1)", 5, "no '('"),
        ("(a = 1", 6, "unexpected end"),
        ("a = 1 AND", 9, "unexpected end"),
        ("a = 1 AND  ", 9, "unexpected end"),
        ("a = ", 3, "expected a value"),
        ('a = "x"', 4, "single quotes"),
        ("a != 1", 2, "<>"),
        ("a == 1", 3, "unexpected '='"),
        ("a.b = 1", 1, "unexpected character '.'"),
        ("a = 1 && b = 2", 6, "use AND"),
        ("a = 007", 5, "unexpected '0'"),
        ("a = 5abc", 5, "unexpected 'abc'"),
        ("a IN (1, 2)", 6, "unexpected '1'"),
        ("a IN ()", 6, "unexpected ')'"),
        ("a IN ('x' 'y')", 10, "expected ')', ','"),
        ("a BETWEEN 1", 11, "unexpected end"),
        ("a BETWEEN 1 OR 2", 12, "unexpected 'OR'"),
        ("a IS 5", 5, "unexpected '5'"),
        ("and = 1", 0, "unexpected 'and'"),
        ("a = NOT b", 4, "unexpected 'NOT'"),
        ("a CONTAINS b", 11, "unexpected 'b'"),
        ("a = 1 --x", 6, "unexpected '-'"),  # a line comment needs its end of line (as in Java)
        ("a\x00= 1", 1, "unexpected character '\\x00'"),
        ("é = 1", 0, "unexpected character 'é'"),
        ("\u212a = 1", 0, "unexpected character"),  # KELVIN SIGN: not an ASCII K
        ("aſ = 1", 1, "unexpected character 'ſ'"),
        # compile-time type checks (RocketMQ's checks, at the offending operand)
        ("a > 'x'", 4, "'x' cannot be compared with >"),
        ("'x' < a", 0, "'x' cannot be compared with <"),
        ("a > TRUE", 4, "TRUE cannot be compared with >"),
        ("a > NULL", 4, "NULL cannot be compared with >; use IS NULL"),
        ("(a > 1) > 0", 1, "is a condition"),
        ("a = NULL", 4, "use IS NULL"),
        ("a <> NULL", 5, "use IS NOT NULL"),
        ("NULL = a", 0, "use IS NULL"),
        ("TRUE = 1", 0, "TRUE cannot be compared with 1"),
        ("1 = FALSE", 0, "1 cannot be compared with FALSE"),
        ("a BETWEEN 10 AND 0", 10, "lower bound comes first"),
        ("a BETWEEN -1 AND -10", 10, "lower bound comes first"),
        ("a BETWEEN 'a' AND 'b'", 10, "cannot be compared with BETWEEN"),
        ("a NOT BETWEEN 1 AND NULL", 20, "cannot be compared with NOT BETWEEN"),
        ("1 IN ('x')", 0, "IN needs a property"),
        ("5", 0, "not a condition"),
        ("'x'", 0, "not a condition"),
        ("-a", 0, "not a condition"),
        ("a = 1 AND 5", 10, "not a condition"),
        ("NOT 'x'", 4, "not a condition"),
        ("a > 9223372036854775808", 4, "does not fit in 64 bits"),
        ("a > 1e999", 4, "too large"),
    ],
)
def test_errors_name_their_position(expression: str, position: int, fragment: str) -> None:
    with pytest.raises(Sql92Error) as err:
        compile_sql92(expression)
    exc = err.value
    assert isinstance(exc, ValueError)
    assert (exc.expression, exc.position) == (expression, position), str(exc)
    assert fragment in str(exc)
    assert f"at position {position}:" in str(exc)
    assert str(exc).startswith(f'SQL92 expression "{expression}": ')


def test_error_message_format_of_the_interface() -> None:
    with pytest.raises(Sql92Error) as err:
        compile_sql92("a >> 5")
    assert str(err.value).startswith('SQL92 expression "a >> 5": syntax error at position 3: ')
    assert err.value.reason.startswith("unexpected '>'")


def test_too_long_and_too_deep_expressions_are_refused() -> None:
    long_expr = " OR ".join(f"a = {i}" for i in range(1000))
    assert len(long_expr) > EXPRESSION_MAX_CHARS
    with pytest.raises(Sql92Error) as err:
        compile_sql92(long_expr)
    assert err.value.position == EXPRESSION_MAX_CHARS
    assert "limit is 4096" in str(err.value)
    assert len(str(err.value)) < 400  # a long expression is shown as an excerpt

    # Flat AND/OR chains are not deep: hundreds of conditions compile and evaluate.
    wide = " OR ".join(f"a = {i}" for i in range(300))
    assert compile_sql92(wide).matches({"a": "299"})

    for deep in (
        "NOT " * (NESTING_MAX + 1) + "a = 1",
        "(a = 1 OR " * (NESTING_MAX + 1) + "b = 2" + ")" * (NESTING_MAX + 1),
        "a = " + "- " * (NESTING_MAX + 1) + "1",
        "a = 1" + " = TRUE" * (NESTING_MAX + 1),
        "(" * 3000 + "a" + ")" * 3000,
    ):
        with pytest.raises(Sql92Error) as err:
            compile_sql92(deep)
        assert err.value.kind in ("expression too deep", "expression too long"), str(err.value)

    ok = "NOT " * (NESTING_MAX - 3) + "a = 1"  # an odd number of NOTs
    assert compile_sql92(ok).matches({"a": "2"})


def test_wrapped_parentheses_alone_do_not_count_as_depth() -> None:
    assert match("(" * 200 + "a = 1" + ")" * 200, a="1")


# -- fuzz --------------------------------------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "c", "TAGS", "x_1"])
VALUES = st.one_of(
    st.sampled_from(["", "0", "3", "-3", "+3", "3.5", "1e3", "NaN", "Infinity", "true", "x"]),
    st.text(max_size=12),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True).map(str),
)
PROPS = st.dictionaries(NAMES, VALUES, max_size=5)


def _literal(draw: st.DrawFn) -> str:
    return draw(
        st.one_of(
            st.integers(-(10**19), 10**19).map(str),
            st.floats(allow_nan=False, allow_infinity=False).map(repr),
            st.sampled_from(["TRUE", "FALSE", "NULL", "0.0", ".5", "5.", "1e3", "7L"]),
            st.text(alphabet="ab' ", max_size=5).map(lambda s: "'" + s.replace("'", "''") + "'"),
        )
    )


@st.composite
def operands(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(NAMES) if draw(st.booleans()) else _literal(draw)
    inner = draw(conditions(depth + 1))
    return draw(st.sampled_from(["({})", "+({})", "-({})"])).format(inner)


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> str:
    """Expressions from the grammar: mostly valid, some type errors, no syntax errors."""
    if depth > 3:
        return f"{draw(NAMES)} = {_literal(draw)}"
    kind = draw(st.integers(0, 9))
    a = draw(operands(depth + 1))
    if kind == 0:
        op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
        return f"{a} {op} {draw(operands(depth + 1))}"
    if kind == 1:
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{a} {neg}BETWEEN {draw(operands(depth + 1))} AND {draw(operands(depth + 1))}"
    if kind == 2:
        items = draw(st.lists(st.text(alphabet="xy'3", max_size=3), min_size=1, max_size=4))
        quoted = ", ".join("'" + s.replace("'", "''") + "'" for s in items)
        return f"{draw(NAMES)} {draw(st.sampled_from(['', 'NOT ']))}IN ({quoted})"
    if kind == 3:
        return f"{a} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 4:
        op = draw(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]))
        search = draw(st.sampled_from(["", "x", "3"]))
        return f"{a} {draw(st.sampled_from(['', 'NOT ']))}{op} '{search}'"
    if kind in (5, 6):
        join = draw(st.sampled_from([" AND ", " OR ", " and ", " Or "]))
        parts = draw(st.lists(conditions(depth + 1), min_size=2, max_size=3))
        return "(" + join.join(parts) + ")"
    if kind == 7:
        return f"NOT {draw(conditions(depth + 1))}"
    return a


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conditions(), st.lists(PROPS, min_size=1, max_size=4))
def test_fuzz_grammar_expressions(expression: str, props_list: list[dict[str, str]]) -> None:
    try:
        f = compile_sql92(expression)
    except Sql92Error as exc:
        assert 0 <= exc.position <= len(expression)
        assert exc.kind != "syntax error", str(exc)  # the generator writes valid syntax
        return
    for props in props_list:
        assert f.matches(props) in (True, False)
        # matches() swallows exceptions; underneath, only a failed conversion may raise
        with contextlib.suppress(sql92._EvalError):
            assert f._evaluate(props) in (True, False, None)
        # NOT never turns a non-match into a match unless the result was a plain FALSE
        negated = compile_sql92(f"NOT ({expression})").matches(props)
        assert not (negated and f.matches(props))


TOKENS = st.sampled_from(
    ["a", "b", "1", "2.5", "-", "+", "'x'", "'", "(", ")", "=", "<>", "<", ">=", ",", "AND",
     "OR", "NOT", "IN", "BETWEEN", "IS", "NULL", "TRUE", "CONTAINS", "--", "/*", "*/", "\n",
     "é", "\x00", '"', "$", "1e", ".", "L"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=40),
        st.lists(TOKENS, max_size=25).map(" ".join),
        st.lists(TOKENS, max_size=25).map("".join),
    ),
    PROPS,
)
def test_fuzz_random_text(expression: str, props: dict[str, str]) -> None:
    try:
        f = compile_sql92(expression)
    except Sql92Error as exc:
        assert 0 <= exc.position <= max(len(expression), 0)
        assert str(exc).startswith("SQL92 expression ")
        return
    assert f.matches(props) in (True, False)
    with contextlib.suppress(sql92._EvalError):
        assert f._evaluate(props) in (True, False, None)
