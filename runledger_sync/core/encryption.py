"""Encryption at rest: AES-256-GCM keys, the sealed envelope, and the keyed digest of a request.

A sealed value is stored in its own jsonb column as one small object::

    {"$rl.enc": ["2026-12", "<base64 of nonce and ciphertext>"]}

The key id sits beside the ciphertext, so a reader knows which key opens it
(and says which one it lacks), and rotation finds the rows still under an old
key with one comparison. The associated data is the row's job id: a ciphertext
copied into another row fails its tag instead of opening there.

An idempotent request is compared by a keyed digest, stored the same way::

    {"$rl.digest": ["2026-12", "<hex HMAC-SHA256>"]}

The store decides where values are sealed and opened; this module only knows
the crypto and the two envelopes. Nothing here logs or repeats a value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
from decimal import Decimal
from typing import Any, Mapping, Optional
from uuid import UUID

from runledger_sync.core.encryption_errors import DecryptionFailed, EncryptionKeyMissing, InvalidEncryptionKey
from runledger_sync.core.errors import MissingExtra

#: The variables :meth:`Encryption.from_env` reads.
KEYS_VARIABLE = "RUNLEDGER_ENCRYPTION_KEYS"
CURRENT_VARIABLE = "RUNLEDGER_ENCRYPTION_CURRENT"

SEALED_FIELD = "$rl.enc"
DIGEST_FIELD = "$rl.digest"
#: How a sealed value's text starts, as written here and as jsonb prints it back:
#: one test of a string tells a sealed value from a clear one.
SEALED_PREFIX = '{"' + SEALED_FIELD + '": ["'
_KEY_BYTES = 32
_NONCE_BYTES = 12
# Ids go into the environment's "id:base64,..." list and into JSON text unescaped.
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DIGEST_LABEL = b"runledger-sync request digest"


class SealedValue(str):
    """A value this process cannot open, in a record's field in place of the value.

    It is the text an operator reads (``encryption key 2026-12 missing``), so
    ``jobs show``, ``--json`` and the dashboard print it as it is. ``problem`` is
    ``missing`` (no key of this id here) or ``invalid`` (the key does not open
    it: other key bytes, or a ciphertext copied from another row).
    """

    key_id: str
    problem: str

    def __new__(cls, key_id: str, problem: str = "missing") -> "SealedValue":
        words = (f"encryption key {key_id} missing" if problem == "missing"
                 else f"encryption key {key_id} does not open this value")
        made = super().__new__(cls, words)
        made.key_id = key_id
        made.problem = problem
        return made

    def __reduce__(self) -> Any:
        return (SealedValue, (self.key_id, self.problem))


class Encryption:
    """AES-256-GCM keys by id, one of them current: new values are sealed under it.

    Example:
        ``rl.configure_encryption(rl.Encryption(keys={"2026-12": key32, "2026-06": old_key32}, current="2026-12"))``

    Args:
        keys: Key id -> 32 raw bytes. Ids are 1-64 letters, digits, ``.``, ``_`` or ``-``.
            Keep old keys here until :func:`runledger_sync.rotate_encryption` has moved every row off them.
        current: The id of the key new values are sealed under.

    Raises:
        InvalidEncryptionKey: a key is not 32 bytes, an id is malformed, or ``current`` is not among ``keys``.
        MissingExtra: the ``cryptography`` package (extra ``encryption``) is not installed.
    """

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # pragma: no cover - the extra is installed for the tests
            raise MissingExtra("encryption", "cryptography") from None
        if not keys:
            raise InvalidEncryptionKey("encryption needs at least one key")
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise InvalidEncryptionKey(
                    f"encryption key id {key_id!r} must be 1-64 letters, digits, '.', '_' or '-'")
            if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
                raise InvalidEncryptionKey(f"encryption key {key_id} must be {_KEY_BYTES} bytes")
        if current not in keys:
            raise InvalidEncryptionKey(f"current encryption key {current!r} is not among the keys")
        self.current = current
        self.key_ids = frozenset(keys)
        self._keys = {key_id: bytes(key) for key_id, key in keys.items()}
        self._ciphers = {key_id: AESGCM(bytes(key)) for key_id, key in keys.items()}
        # One HMAC key per AES key, derived so the two uses never share a key.
        self._digest_keys = {key_id: hmac.new(bytes(key), _DIGEST_LABEL, hashlib.sha256).digest()
                             for key_id, key in keys.items()}

    def __repr__(self) -> str:
        return f"Encryption(keys={sorted(self.key_ids)}, current={self.current!r})"

    def __reduce__(self) -> Any:
        # Handed to a worker process spawned with --processes; never logged (repr names ids only).
        return (Encryption, (self._keys, self.current))

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Encryption":
        """Build the keys from ``RUNLEDGER_ENCRYPTION_KEYS="id:base64,id:base64"`` and ``RUNLEDGER_ENCRYPTION_CURRENT=id``.

        Without ``RUNLEDGER_ENCRYPTION_CURRENT`` the first key listed is current.

        Raises:
            InvalidEncryptionKey: the variable is unset or blank, an entry is not ``id:base64``,
                the base64 is malformed, or a key is not 32 bytes.
        """
        env = os.environ if environ is None else environ
        listed = (env.get(KEYS_VARIABLE) or "").strip()
        if not listed:
            raise InvalidEncryptionKey(f"{KEYS_VARIABLE} is not set")
        keys: dict[str, bytes] = {}
        for entry in listed.split(","):
            key_id, sep, encoded = entry.strip().partition(":")
            if not sep:
                raise InvalidEncryptionKey(f"{KEYS_VARIABLE} entries must be id:base64 (entry {key_id!r} has no ':')")
            try:
                keys[key_id] = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidEncryptionKey(f"encryption key {key_id} in {KEYS_VARIABLE} is not valid base64") from None
        current = (env.get(CURRENT_VARIABLE) or "").strip() or next(iter(keys))
        return cls(keys=keys, current=current)

    # -- sealing ------------------------------------------------------------------

    def seal(self, text: str, row_id: UUID) -> str:
        """The envelope of JSON ``text`` under the current key, bound to ``row_id``."""
        return self.seal_many([text], [row_id.hex])[0]

    def seal_many(self, texts: list[str], row_ids_hex: list[str]) -> list[str]:
        """:meth:`seal` of each text for the row whose id is given as hex digits (dashes allowed), in one go.

        One read of the random source for every nonce: an enqueue of a thousand jobs seals a thousand payloads.
        """
        nonces = os.urandom(_NONCE_BYTES * len(texts))
        encrypt = self._ciphers[self.current].encrypt
        head = f'{SEALED_PREFIX}{self.current}", "'
        sealed = []
        for index, (text, row_id) in enumerate(zip(texts, row_ids_hex, strict=True)):
            nonce = nonces[index * _NONCE_BYTES:(index + 1) * _NONCE_BYTES]
            blob = nonce + encrypt(nonce, text.encode("utf-8"), bytes.fromhex(row_id.replace("-", "")))
            sealed.append(f'{head}{base64.b64encode(blob).decode("ascii")}"]}}')
        return sealed

    def open(self, envelope: Any, row_id: UUID) -> str:
        """The JSON text sealed in ``envelope`` (its text, or the decoded object) for ``row_id``.

        Raises:
            EncryptionKeyMissing: the envelope's key is not held here.
            DecryptionFailed: the key does not open it (other key bytes, or another row's ciphertext).
        """
        key_id, blob = _parts(envelope)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise EncryptionKeyMissing(f"encryption key {key_id} missing", key_id=key_id)
        try:
            raw = base64.b64decode(blob)
            return cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], row_id.bytes).decode("utf-8")
        except Exception:  # noqa: BLE001 - InvalidTag, bad base64, bad UTF-8: all one refusal
            raise DecryptionFailed(f"encryption key {key_id} does not open the value of row {row_id}",
                                   key_id=key_id) from None

    # -- digests ------------------------------------------------------------------

    def digest(self, text: str) -> str:
        """The envelope of a keyed digest (HMAC-SHA256) of JSON ``text`` under the current key.

        The digest is of the value, not its spelling: key order and a number's
        form (``1``, ``1.0``) do not change it, as they do not change a clear comparison.
        """
        return self._digest_under(self.current, text)

    def same_digest(self, stored: Any, text: str) -> bool:
        """Whether ``stored`` (a digest envelope) is the digest of ``text``, under the key it names.

        Raises:
            EncryptionKeyMissing: the digest's key is not held here.
        """
        key_id, _ = stored[DIGEST_FIELD]
        if key_id not in self._digest_keys:
            raise EncryptionKeyMissing(f"encryption key {key_id} missing", key_id=key_id)
        return hmac.compare_digest(json.loads(self._digest_under(key_id, text))[DIGEST_FIELD][1], stored[DIGEST_FIELD][1])

    def keyed_hash(self, text: str) -> str:
        """A keyed hex digest of ``text`` under the current key (for a unique key made from a payload)."""
        return hmac.new(self._digest_keys[self.current], text.encode("utf-8"), hashlib.sha256).hexdigest()

    def _digest_under(self, key_id: str, text: str) -> str:
        canonical = _canonical(json.loads(text, parse_float=Decimal, parse_int=Decimal))
        mac = hmac.new(self._digest_keys[key_id], canonical.encode("utf-8"), hashlib.sha256).hexdigest()
        return f'{{"{DIGEST_FIELD}": ["{key_id}", "{mac}"]}}'


def _canonical(value: Any) -> str:
    """One spelling per JSON value: keys sorted, numbers as their normalized decimal."""
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(key) + ":" + _canonical(value[key]) for key in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_canonical(item) for item in value) + "]"
    if isinstance(value, Decimal):
        return "0" if value == 0 else str(value.normalize())
    return json.dumps(value)


def _parts(envelope: Any) -> tuple[str, str]:
    if isinstance(envelope, str):
        if envelope.startswith(SEALED_PREFIX) and envelope.endswith('"]}'):
            # The one spelling written here and printed by jsonb: cut, not parsed (the claim opens every payload).
            key_id, _, blob = envelope[len(SEALED_PREFIX):-3].partition('", "')
            return key_id, blob
        envelope = json.loads(envelope)
    key_id, blob = envelope[SEALED_FIELD]
    return key_id, blob


def closed_value(job: Any) -> Optional[SealedValue]:
    """What keeps a job record's payload or checkpoint closed in this process, or None when both are open."""
    for value in (job.payload, job.checkpoint):
        if isinstance(value, SealedValue):
            return value
    return None


def missing_key(job: Any) -> Optional[SealedValue]:
    """Like :func:`closed_value`, but only for a key this process does not hold: such a claim is handed back."""
    closed = closed_value(job)
    return closed if closed is not None and closed.problem == "missing" else None


def is_digest(value: Any) -> bool:
    """Whether a stored request snapshot is a keyed digest rather than the clear request."""
    return isinstance(value, dict) and DIGEST_FIELD in value and len(value) == 1


def sealed_key_id(text: str) -> Optional[str]:
    """The key id of a sealed value's text, or None when the text is a clear value."""
    if not text.startswith(SEALED_PREFIX):
        return None
    return text[len(SEALED_PREFIX):text.index('"', len(SEALED_PREFIX))]


_decode_json = json.JSONDecoder().raw_decode

# -- the process's keys ---------------------------------------------------------------

_active: Optional[Encryption] = None


def configure_encryption(encryption: Optional[Encryption]) -> None:
    """Seal every new payload, checkpoint, output and snapshot of this process with ``encryption``'s keys.

    Call it once, before the first enqueue or worker start; None turns sealing off
    again (values already sealed still need their keys to be read).

    Example:
        ``rl.configure_encryption(rl.Encryption.from_env())``
    """
    global _active
    if encryption is not None and not isinstance(encryption, Encryption):
        raise TypeError("configure_encryption takes an Encryption or None")
    _active = encryption


def active_encryption() -> Optional[Encryption]:
    """The keys :func:`configure_encryption` set for this process, or None."""
    return _active


def open_text(text: str, row_id: UUID) -> Any:
    """The value of a sealed ``text`` for ``row_id``, or a :class:`SealedValue` saying why it stays closed."""
    encryption = _active
    key_id = sealed_key_id(text) or ""
    if encryption is None or key_id not in encryption.key_ids:
        return SealedValue(key_id)
    try:
        return _decode_json(encryption.open(text, row_id))[0]
    except DecryptionFailed:
        return SealedValue(key_id, "invalid")
