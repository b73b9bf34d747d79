"""Typed payloads: pydantic models as a job type's payload (the optional extra ``pydantic``).

Nothing here imports pydantic. A value can only be a pydantic model if pydantic
is already imported (the application built the model), so the checks look for
the module in ``sys.modules``; without the extra, payloads stay plain JSON and
this module costs a dictionary lookup.

One rule on both sides: a payload is valid for model ``M`` when
``M.model_validate(payload)`` accepts it, where ``payload`` is what the job row
holds (the JSON-mode dump of a model instance). The handler then gets that
instance. Errors name each field's path and pydantic's message, never the input
value: pydantic puts the value into its errors, and a payload may hold secrets.
"""

from __future__ import annotations

import sys
from typing import Any

from runledger_sync.core.errors import InvalidPayload

#: How many of pydantic's errors a message lists; the count says how many more there were.
MAX_LISTED_ERRORS = 5


def _pydantic() -> Any:
    return sys.modules.get("pydantic")


def is_model_class(value: Any) -> bool:
    """True when ``value`` is a pydantic model class (pydantic 2)."""
    pydantic = _pydantic()
    return pydantic is not None and isinstance(value, type) and issubclass(value, pydantic.BaseModel)


def is_model_instance(value: Any) -> bool:
    pydantic = _pydantic()
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def stored_payload(value: Any, argument: str = "payload") -> Any:
    """The JSON value to store for ``value``: a model instance's JSON-mode dump, checked against its class; else ``value``.

    The dump is validated again by the instance's own class, as the handler will:
    an instance built with ``model_construct`` or changed after it was built may
    hold what its class refuses.

    Raises:
        InvalidPayload: the dump is not valid for the instance's class (``job.invalid_payload``).
    """
    if not is_model_instance(value):
        return value
    # No serializer warnings: they repeat the value; the validation below names what is wrong.
    dumped = value.model_dump(mode="json", warnings=False)
    validated(type(value), dumped, argument)
    return dumped


def validated(model: Any, payload: Any, argument: str = "payload") -> Any:
    """Return ``model.model_validate(payload)``.

    Raises:
        InvalidPayload: ``payload`` is not valid for ``model``; the message lists
            the fields' paths and what is wrong with each, never their values.
    """
    pydantic = _pydantic()
    try:
        return model.model_validate(payload)
    except pydantic.ValidationError as error:
        problems, count = error_lines(error), error.error_count()
    # Raised outside the except block: pydantic's error, which repeats the values, is not kept as the context.
    raise invalid_payload(model, argument, problems, count)


def error_lines(error: Any) -> list[str]:
    """``path: message`` for each of a pydantic ValidationError's errors, without the input values."""
    lines = []
    for item in error.errors(include_url=False, include_context=False, include_input=False):
        path = ".".join(str(part) for part in item["loc"]) or "(the payload)"
        lines.append(f"{path}: {item['msg']}")
    return lines


def invalid_payload(model: Any, argument: str, problems: list[str], count: int) -> InvalidPayload:
    """The ``job.invalid_payload`` error of ``count`` problems; ``details["errors"]`` lists them."""
    listed = "; ".join(problems[:MAX_LISTED_ERRORS])
    more = f"; and {count - MAX_LISTED_ERRORS} more" if count > MAX_LISTED_ERRORS else ""
    error = InvalidPayload(argument, None, f"valid for {model.__name__}",
                           got=f"{count} error{'s' if count != 1 else ''}: {listed}{more}")
    error.details["errors"] = problems
    return error
