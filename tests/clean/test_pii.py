"""PII redaction: what is redacted, what must survive, and the counts per kind."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean.pii import KINDS, redact

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP_ADDRESS>", "phone": "<PHONE_NUMBER>"}


SAMPLES = [
    ("Mail john.doe+news@mail.example.co.uk now.", "Mail <EMAIL> now.", {"email": 1}),
    ("a@b.io, c_d@e-f.org", "<EMAIL>, <EMAIL>", {"email": 2}),
    ("Host 192.168.0.1 and 10.0.0.255.", "Host <IP_ADDRESS> and <IP_ADDRESS>.", {"ip": 2}),
    ("v6 2001:db8::1, ::1 and fe80::1ff:fe23:4567:890a", "v6 <IP_ADDRESS>, <IP_ADDRESS> and <IP_ADDRESS>", {"ip": 3}),
    ("full 2001:0db8:85a3:0000:0000:8a2e:0370:7334", "full <IP_ADDRESS>", {"ip": 1}),
    ("mapped ::ffff:192.0.2.1", "mapped ::ffff:<IP_ADDRESS>", {"ip": 1}),
    ("Call +1 415 555 2671 today", "Call <PHONE_NUMBER> today", {"phone": 1}),
    ("(555) 123-4567 or 555-123-4567 or 555.123.4567", "<PHONE_NUMBER> or <PHONE_NUMBER> or <PHONE_NUMBER>", {"phone": 3}),
    ("UK 020 7946 0958, FR +33 1 23 45 67 89", "UK <PHONE_NUMBER>, FR <PHONE_NUMBER>", {"phone": 2}),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected", "counts"), SAMPLES)
def test_redacts_and_counts(text, expected, counts):
    redacted, found = redact(text, PLACEHOLDERS)
    assert redacted == expected
    assert found == {kind: counts.get(kind, 0) for kind in KINDS}


@pytest.mark.parametrize(
    "text",
    [
        "Version 1.2.3.4.5 and 256.1.1.1 are not addresses.",
        "It is 12:30:45 and std::vector or a::b are code.",
        "Years 1990 2000 2010, the range 2019-2020, price 1.234.567 and ISBN 978-3-16-148410-0.",
        "An @mention, user@localhost and foo@bar are not e-mail addresses.",
        "Order #12345678 shipped on 2024-03-01.",
    ],
)
def test_leaves_lookalikes_alone(text):
    assert redact(text, PLACEHOLDERS) == (text, dict.fromkeys(KINDS, 0))


@given(st.text(alphabet=st.characters(blacklist_characters="@:.0123456789+()-")))
def test_text_without_addresses_or_digits_is_untouched(text):
    assert redact(text, PLACEHOLDERS)[0] == text


def test_placeholders_are_literal():
    redacted, _ = redact("x a@b.io y", {**PLACEHOLDERS, "email": r"$1 \g<0>"})
    assert redacted == r"x $1 \g<0> y"


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789abcdefABCDEF.:@+()- _xyz", max_size=40))
def test_each_gate_is_a_necessary_condition(text):
    """The Spark job runs a kind's full pattern only where its cheap gate matches."""
    import re

    from pipeline.clean.pii import GATES, PATTERNS

    for kind, pattern in PATTERNS.items():
        for match in re.finditer(pattern, text):
            found = match.group()
            assert GATES[kind] in found if kind == "email" else re.search(GATES[kind], found), (kind, found)
