"""The encryption family of errors: keys that cannot be used, values that cannot be opened."""

from __future__ import annotations

from runledger_sync.core.errors import ConfigError, RunledgerError


class InvalidEncryptionKey(ConfigError):
    """An encryption key is not 32 bytes, not base64, has a malformed id, or the current key id is not among the keys."""

    code = "encryption.invalid_key"

    def __init__(self, problem: str | list[str]) -> None:
        super().__init__([problem] if isinstance(problem, str) else problem)


class EncryptionKeyMissing(RunledgerError):
    """A value is sealed under an encryption key this process does not hold."""

    code = "encryption.key_missing"


class DecryptionFailed(RunledgerError):
    """A sealed value does not open under its key and row: the key bytes differ, or it was copied from another row."""

    code = "encryption.decryption_failed"
