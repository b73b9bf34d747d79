"""Version-7 ids: the text form the claim sends, and their order."""

from __future__ import annotations

from uuid import UUID

from runledger_sync.core.ids import uuid7, uuid7_strings


def test_uuid7_strings_are_version_7_uuids_in_canonical_text_that_increase_strictly():
    strings = uuid7_strings(5_000)
    parsed = [UUID(text) for text in strings]
    assert [str(u) for u in parsed] == strings
    assert all(u.version == 7 and u.variant == "specified in RFC 4122" for u in parsed)
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)


def test_uuid7_and_uuid7_strings_share_one_sequence():
    before, [middle], after = uuid7(), uuid7_strings(1), uuid7()
    assert before < UUID(middle) < after
