"""Job metadata: a small object of text keys and text values that travels with a job.

Metadata is for what surrounds a job rather than what it works on: a tenant, a
request id, a trace context. It is stored with the job (``job_queue.meta``),
kept by every retry, continuation and requeue, read by handlers and middleware
as ``ctx.meta``, and left out of the idempotency comparison: two requests that
differ only in their metadata are the same request.

It is capped, so a claim that reads a batch of jobs stays cheap: at most
:data:`MAX_META_KEYS` keys of at most :data:`MAX_META_KEY_CHARS` characters,
and :data:`MAX_META_BYTES` bytes of JSON in all.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from runledger_sync.core.errors import InvalidMeta, InvalidPayload
from runledger_sync.core.validation import serialize_json

MAX_META_KEYS = 32
MAX_META_KEY_CHARS = 128
MAX_META_BYTES = 4096
#: What an enqueue without metadata stores.
EMPTY_META_JSON = "{}"

_EXPECTED = "a mapping of str keys to str values"


def meta_json(meta: Optional[Mapping[str, str]], argument: str = "meta") -> str:
    """Return ``meta`` as the JSON text stored with the job; ``{}`` for None.

    Raises:
        InvalidMeta: not a mapping of str to str, more than :data:`MAX_META_KEYS`
            keys, a blank or too long key, a value jsonb cannot hold (a NUL
            character, a lone surrogate), or more than :data:`MAX_META_BYTES`
            bytes of JSON. The message names the key at fault, never a value.
    """
    if meta is None:
        return EMPTY_META_JSON
    if not isinstance(meta, Mapping):
        raise InvalidMeta(argument, meta, _EXPECTED)
    if len(meta) > MAX_META_KEYS:
        raise InvalidMeta(argument, meta, f"at most {MAX_META_KEYS} keys", got=f"{len(meta)} keys")
    for key, value in meta.items():
        _check_key(argument, key)
        if not isinstance(value, str):
            raise InvalidMeta(f"{argument}[{key!r}]", value, "a str")
    try:
        text = serialize_json(argument, dict(meta))
    except InvalidPayload as error:
        raise InvalidMeta(argument, None, "text jsonb can store", got=error.value) from None
    size = len(text.encode("utf-8"))
    if size > MAX_META_BYTES:
        raise InvalidMeta(argument, meta, f"at most {MAX_META_BYTES} bytes of JSON", got=f"{size} bytes of JSON")
    return text


def merged_meta(given: Optional[Mapping[str, str]], added: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """``added`` under ``given``: a key the caller gave keeps the caller's value."""
    if not added:
        return None if given is None else dict(given)
    if given is not None and not isinstance(given, Mapping):
        # Left for meta_json to refuse with its coded error.
        return given
    return {**added, **(given or {})}


def _check_key(argument: str, key: Any) -> None:
    if not isinstance(key, str):
        raise InvalidMeta(f"{argument} keys", key, "str")
    if not key.strip():
        raise InvalidMeta(f"{argument} keys", key, "non-blank", got="a blank key")
    if len(key) > MAX_META_KEY_CHARS:
        raise InvalidMeta(f"{argument} keys", key, f"at most {MAX_META_KEY_CHARS} characters",
                          got=f"a key of {len(key)} characters")
