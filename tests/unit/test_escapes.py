"""Text from callers, handlers and upstream services is shown with every control character escaped visibly."""

from __future__ import annotations

import pytest

from runledger_sync.core.escapes import escape_controls


@pytest.mark.parametrize(("text", "shown"), [
    ("a\nb", "a\\x0ab"),                       # a forged log line
    ("a\r\nb", "a\\x0d\\x0ab"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),   # a terminal's escape sequence
    ("tab\there", "tab\\x09here"),
    ("nul\x00", "nul\\x00"),
    ("del\x7f", "del\\x7f"),
    ("csi\x9b2J", "csi\\x9b2J"),               # C1: one-byte CSI
    ("next\x85line", "next\\x85line"),
    ("line\u2028sep", "line\\u2028sep"),
    ("abc\u202edcba", "abc\\u202edcba"),        # a right-to-left override reorders what follows
    ("report-\udcff.csv", "report-\\udcff.csv"),   # a file name's bad byte: no UTF-8 stream can write it
    ("plain text, ünïcode and 😀", "plain text, ünïcode and 😀"),
    ("", ""),
])
def test_every_control_character_is_escaped_and_other_text_is_kept(text, shown):
    assert escape_controls(text) == shown


def test_the_escaped_text_has_no_control_character_left():
    everything = "".join(chr(code) for code in range(0x2070))
    escaped = escape_controls(everything)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in escaped)
    assert "\u2028" not in escaped and "\u202e" not in escaped
