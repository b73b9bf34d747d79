"""Where the store seals and opens values: one call at each write and read of a sealable column.

With no keys configured (:func:`runledger_sync.configure_encryption`) a value
is written as it was given: :func:`sealed` hands the text back untouched. A
sealed value is read back as itself whether or not this process has keys, so
a process without the key sees a :class:`~runledger_sync.core.encryption.SealedValue`
naming the key, never an envelope taken for a payload.
"""

from __future__ import annotations

import json
from typing import Any, Optional
from uuid import UUID

from runledger_sync.core.encryption import SEALED_FIELD, active_encryption, open_text

__all__ = ["opened", "sealed", "sealed_object"]


def sealed(text: Optional[str], row_id: Any) -> Optional[str]:
    """JSON ``text`` sealed for the row ``row_id`` under the current key; ``text`` itself without keys."""
    encryption = active_encryption()
    if text is None or encryption is None:
        return text
    return encryption.seal(text, row_id if isinstance(row_id, UUID) else UUID(str(row_id)))


def sealed_object(value: Any, text: str, row_id: UUID) -> Any:
    """For a jsonb column bound as a Python object: ``value`` itself without keys, else its envelope as an object."""
    encryption = active_encryption()
    if encryption is None:
        return value
    key_id, blob = _envelope_parts(encryption.seal(text, row_id))
    return {SEALED_FIELD: [key_id, blob]}


def opened(value: Any, row_id: Any) -> Any:
    """A jsonb value as the driver decoded it: opened when it is an envelope, else as it is."""
    if isinstance(value, dict) and len(value) == 1 and SEALED_FIELD in value and row_id is not None:
        key_id, blob = value[SEALED_FIELD]
        return open_text(f'{{"{SEALED_FIELD}": ["{key_id}", "{blob}"]}}', row_id)
    return value


def _envelope_parts(text: str) -> tuple[str, str]:
    key_id, blob = json.loads(text)[SEALED_FIELD]
    return key_id, blob
