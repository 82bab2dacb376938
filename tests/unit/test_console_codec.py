"""The console codec, sans-IO: framing of statements and the YAML of answers (no sockets)."""

from __future__ import annotations

import pytest

from boxqueue.iproto import console_codec as cc
from boxqueue.iproto.console_yaml import EMPTY_DOCUMENT, error_document, values_document
from boxqueue.spaces.msgpack_values import Raw, pack


def events(decoder: cc.ConsoleDecoder) -> list[object]:
    out = []
    while (event := decoder.next_event()) is not None:
        out.append(event)
    return out


def test_one_statement_per_line():
    d = cc.ConsoleDecoder()
    d.feed(b"1 + 1\nreturn 2\n")
    assert events(d) == [cc.Statement("1 + 1"), cc.Statement("return 2")]


def test_statement_split_across_chunks_waits_for_its_end():
    d = cc.ConsoleDecoder()
    d.feed(b"box.space.te")
    assert d.next_event() is None
    d.feed(b"st:len()")
    assert d.next_event() is None
    d.feed(b"\n")
    assert events(d) == [cc.Statement("box.space.test:len()")]


def test_crlf_is_one_end_even_when_split():
    d = cc.ConsoleDecoder()
    d.feed(b"1\r\n2\r")
    assert events(d) == [cc.Statement("1"), cc.Statement("2")]
    d.feed(b"\n3\n")
    assert events(d) == [cc.Statement("3")]


def test_delimiter_joins_lines_until_it_ends_one():
    d = cc.ConsoleDecoder()
    d.delimiter = "$EOF$"
    d.feed(b"local x = 1\nreturn x$EOF$\nnext")
    assert events(d) == [cc.Statement("local x = 1\nreturn x")]
    d.feed(b"$EOF")
    assert d.next_event() is None
    d.feed(b"$\n")
    assert events(d) == [cc.Statement("next")]


def test_a_delimiter_set_midway_applies_to_what_is_buffered():
    d = cc.ConsoleDecoder()
    d.feed(b"\\set delimiter !\na\nb!\n")
    first = d.next_event()
    assert first == cc.Command(("set", "delimiter", "!"))
    d.delimiter = "!"
    assert events(d) == [cc.Statement("a\nb")]


def test_commands_and_close():
    d = cc.ConsoleDecoder()
    d.feed(b"\\help\n\\login alice secret\n~.\n")
    assert events(d) == [cc.Command(("help",)), cc.Command(("login", "alice", "secret")), cc.Close()]


def test_invalid_utf8_survives_the_round_trip():
    d = cc.ConsoleDecoder()
    d.feed(b"'\xff'\n")
    (statement,) = events(d)
    assert statement.text.encode("utf-8", "surrogateescape") == b"'\xff'"


def test_too_long_a_statement_is_refused():
    d = cc.ConsoleDecoder(max_statement_bytes=100)
    d.feed(b"x" * 60)
    assert d.next_event() is None
    d.feed(b"x" * 60)
    with pytest.raises(cc.StatementTooLong):
        d.next_event()


@pytest.mark.parametrize(
    "text",
    ['require("console").delimiter("$EOF$")', "require('console').delimiter('$EOF$')", "require 'console'.delimiter('$EOF$')"],
)
def test_the_delimiter_statement_is_recognised(text):
    match = cc.DELIMITER_STATEMENT.match(text)
    assert match is not None and match.group(3) == "$EOF$"


@pytest.mark.parametrize(
    ("text", "user", "password"),
    [
        ("require('console').login('alice', 'secret')", "alice", "secret"),
        ('require("console").login("a", "p w")', "a", "p w"),
        ("require('console').login('guest')", "guest", None),
    ],
)
def test_the_login_statement_is_recognised(text, user, password):
    match = cc.LOGIN_STATEMENT.match(text)
    assert match is not None and (match.group(3), match.group(5)) == (user, password)


def test_a_login_with_more_code_is_not_the_login_statement():
    assert cc.LOGIN_STATEMENT.match("require('console').login('a', 'x') os.exit()") is None


def test_other_statements_are_not_the_delimiter_statement():
    assert cc.DELIMITER_STATEMENT.match("require('console').delimiter('x'); os.exit()") is None


# -- YAML (expected strings as Tarantool 2.6.0's console printed the same values) ------------


def test_nothing_returned():
    assert values_document([]) == EMPTY_DOCUMENT == b"---\n...\n"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([None, True, False], "---\n- null\n- true\n- false\n...\n"),
        ([1, -5, 1.5, 1 / 3, 1e20, 2.0**63, 2.0**64], "---\n- 1\n- -5\n- 1.5\n- 0.33333333333333\n- 1e+20\n"
         "- 9223372036854775808\n- 1.844674407371e+19\n...\n"),
        ([float("inf"), float("-inf"), -0.0, 1.25e-7], "---\n- inf\n- -inf\n- 0\n- 1.25e-07\n...\n"),
        ([""], "---\n-\n...\n"),
        (["yes", "on", "123", "0x1F", "inf", "TRUE"], "---\n- 'yes'\n- on\n- '123'\n- '0x1F'\n- 'inf'\n- TRUE\n...\n"),
        (["a: b", "x:", "a,b", "?q", "`bt"], "---\n- 'a: b'\n- 'x:'\n- a,b\n- ?q\n- '`bt'\n...\n"),
        (["multi\nline"], "---\n- 'multi\n\n  line'\n...\n"),
        (["it's", "'q", "a\tb", "\x01x", "héllo"], "---\n- it's\n- '''q'\n- \"a\\tb\"\n- \"\\x01x\"\n- héllo\n...\n"),
        ([{}], "---\n- []\n...\n"),
        ([[1, 2]], "---\n- - 1\n  - 2\n...\n"),
        ([{"a": 1, "b": [1, 2]}], "---\n- a: 1\n  b:\n  - 1\n  - 2\n...\n"),
        ([{"a": {"b": {"c": 1}}}], "---\n- a:\n    b:\n      c: 1\n...\n"),
        ([Raw(pack([1, "a"]))], "---\n- [1, 'a']\n...\n"),
        ([Raw(pack([1, [2, 3], {"a": 1}, "x y", ""]))], "---\n- [1, [2, 3], {'a': 1}, 'x y', '']\n...\n"),
        ([[Raw(pack([1])), Raw(pack([2]))]], "---\n- - [1]\n  - [2]\n...\n"),
        ([Raw(pack(["a\tb", "it's", None, True]))], "---\n- [\"a\\tb\", 'it''s', null, true]\n...\n"),
        ([{"yes": 1, "1": 2}], "---\n- 'yes': 1\n  '1': 2\n...\n"),
    ],
)
def test_values_print_as_tarantool_prints_them(values, expected):
    assert values_document(values).decode() == expected


def test_long_lines_fold_at_80_columns():
    words = " ".join("abcdefghijklmnopqrstuvwxyz") + " " + " ".join("abcdefghijklmnopqrstu")
    assert values_document([words]).decode() == (
        "---\n- a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n\n"
        "  o p q r s t u\n...\n"
    )


def test_errors():
    assert error_document("boom") == b"---\n- error: boom\n...\n"
    assert error_document("a: b") == b"---\n- error: 'a: b'\n...\n"
    assert error_document(None) == b"---\n- error: null\n...\n"
    assert error_document([1]) == b"---\n- error:\n  - 1\n...\n"
