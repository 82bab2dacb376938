"""The pure parts of the docs' examples harness: markers before fences, and the claims that an
example's comments make about results (tests/integration/test_doc_examples.py runs the examples)."""

from __future__ import annotations

from pathlib import Path

import pytest

from boxqueue.errcodes import ER
from tests.integration.doc_blocks import ROOT, MarkerError, examples_of
from tests.integration.doc_claims import ClaimFailed, claim_of, matches


@pytest.mark.parametrize("comment", [
    "# waits up to 5 s", "# only the taking session may", "# history, then live frames", "# REPLACE",
    '# space 0 "queue": tasks go in through box.queue', "# ... and can be read directly",
    "# 30s or more with ~10,000 tubes (below)", "# 5 seconds",
])
def test_prose_is_no_claim(comment):
    assert claim_of(comment) is None


def test_a_value_with_placeholders_matches_element_by_element():
    claim = claim_of("# [[id, 'emails', 'ready', 'hello']]")
    assert matches(claim.value, [["0f3a", "emails", "ready", "hello"]])
    assert matches(claim.value, [(7, "emails", "ready", "hello")])
    assert not matches(claim.value, [["0f3a", "emails", "taken", "hello"]])
    assert not matches(claim.value, [["0f3a", "emails", "ready", "hello", "extra"]])
    assert not matches(claim.value, [])
    with pytest.raises(ClaimFailed, match="the comment says"):
        claim.check_value([["0f3a", "emails", "taken", "hello"]])


def test_prose_may_follow_a_value_after_a_comma():
    claim = claim_of("# [[0, 't', 'hello']], waits up to 10 s")
    assert matches(claim.value, [[0, "t", "hello"]])
    assert not matches(claim.value, [[0, "r", "hello"]])


def test_mappings_need_the_same_keys_and_braces_with_dots_stand_for_any_mapping():
    claim = claim_of("# [{'tasks': {...}, 'calls': {...}}]")
    assert matches(claim.value, [{"tasks": {"ready": 1}, "calls": {}}])
    assert not matches(claim.value, [{"tasks": {}, "calls": {}, "more": 1}])
    assert not matches(claim.value, [{"tasks": {}, "calls": []}])
    assert not matches(claim.value, {"tasks": {}, "calls": {}})  # not in a list


def test_http_claims_hold_a_status_and_a_json_body():
    claim = claim_of('# 201 {"success":true}')
    assert claim.status == 201
    assert matches(claim.value, {"success": True})
    assert not matches(claim.value, {"success": 1})  # true is not 1
    assert not matches(claim.value, {"success": False})
    body = claim_of('# [{"id":"1","sequence":1,"payload":{...}}]')
    assert body.status is None
    assert matches(body.value, [{"id": "1", "sequence": 1, "payload": {"message": "hello"}}])
    assert not matches(body.value, [{"id": "1", "sequence": 2, "payload": {}}])
    assert claim_of("# 204").status == 204


def test_error_claims_name_an_error_of_the_registry_and_a_part_of_its_message():
    claim = claim_of("""# ER_PROC_LUA "unsupported Lua type 'userdata'\"""")
    assert claim.error == ER.PROC_LUA
    claim.check_error(32, "unsupported Lua type 'userdata'")
    with pytest.raises(ClaimFailed):
        claim.check_error(32, "unsupported Lua type 'function'")
    with pytest.raises(ClaimFailed):
        claim.check_error(33, "unsupported Lua type 'userdata'")
    with pytest.raises(ClaimFailed):
        claim.check_value([[1]])  # it was meant to fail
    with pytest.raises(ValueError, match="names no error"):
        claim_of("# ER_NO_SUCH_THING")


def examples(text: str):
    return examples_of(Path("x.md"), text)


def test_markers_say_how_the_next_fence_runs():
    found = examples(
        "Text.\n\n<!-- example: not run: needs a cluster -->\n```sh\nspark-submit x\n```\n\n"
        "<!-- example: console, fresh server -->\n```\n$ tarantoolctl connect h:1\n```\n\n"
        "<!-- example: in conf/cluster/n1.toml -->\n```toml\n[replication]\n```\n\n"
        "```python\nprint(1)\n```\n"
    )
    assert [(e.line, e.language, sorted(e.words), e.reason) for e in found] == [
        (4, "sh", ["not run"], "needs a cluster"),
        (9, "", ["console", "fresh server"], ""),
        (14, "toml", ["in conf/cluster/n1.toml"], ""),
        (18, "python", [], ""),
    ]
    assert found[2].within == ROOT / "conf/cluster/n1.toml"
    assert found[3].text == "print(1)\n"


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- example: not run -->\n```sh\nx\n```\n", "needs a reason"),
    ("<!-- example: options only:  -->\n```sh\nx\n```\n", "needs a reason"),
    ("<!-- example: consol -->\n```\nx\n```\n", "unknown example marker"),
    ("<!-- example: in conf/nothing.toml -->\n```toml\n```\n", "unknown example marker"),
    ("<!-- example: console -->\n\nA paragraph.\n\n```\nx\n```\n", "not directly before a fenced block"),
    ("```\nx\n```\n\n<!-- example: console -->\n", "followed by no fenced block"),
])
def test_a_marker_that_says_nothing_clear_is_an_error(text, message):
    with pytest.raises(MarkerError, match=message):
        examples(text)
