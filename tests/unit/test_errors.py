"""The error tree: stable, unique, well-formed codes; docstrings as default messages."""

from __future__ import annotations

import importlib
import pkgutil
import re
import types

import pytest

from runledger_sync import core
from runledger_sync.core import errors
from runledger_sync.core.errors import (
    ConfigError,
    InvalidArgument,
    JobCancelled,
    MissingExtra,
    RunledgerError,
)
from runledger_sync.core.error_tree import all_error_classes
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict

CODE_PATTERN = re.compile(r"^[a-z]+(\.[a-z0-9_]+)+$")
CATEGORIES = {"validation", "forbidden", "conflict", "internal"}
CLASSES = all_error_classes()


def instantiate(cls: type) -> BaseException:
    """Build an instance with each constructor's own arguments."""
    if cls is JobCancelled:
        return cls("deadline")
    if cls is MissingExtra:
        return cls("metrics", "prometheus_client")
    if issubclass(cls, ConfigError):
        return cls(["jobs config poll_interval_ms must be > 0, got 0"])
    if issubclass(cls, InvalidArgument):
        return cls("limit", -1, "positive")
    return cls()


def test_tree_is_found():
    # Guards the walk itself: a broken all_error_classes() would make every test below vacuous.
    names = {cls.__name__ for cls in CLASSES}
    assert {
        "RunledgerError",
        "ConfigError",
        "RegistrationError",
        "LeaseOwnerMismatch",
        "JobCancelled",
    } <= names
    assert len(CLASSES) == len(set(CLASSES)) >= 30


def error_modules() -> list[types.ModuleType]:
    """core/errors.py and the family modules beside it (core/*_errors.py)."""
    names = [info.name for info in pkgutil.iter_modules(core.__path__) if info.name.endswith("errors")]
    return [importlib.import_module(f"{core.__name__}.{name}") for name in names]


def test_the_family_modules_are_found():
    assert {module.__name__.rpartition(".")[2] for module in error_modules()} >= {
        "errors",
        "workflow_errors",
        "store_errors",
        "dashboard_errors",
    }


def test_every_error_class_defined_in_the_error_modules_is_in_the_tree():
    defined = {
        obj
        for module in error_modules()
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
    }
    assert defined == set(CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_is_importable_from_the_error_module_that_defines_it(cls):
    # One place per class: core/errors.py does not re-export the families.
    module = importlib.import_module(cls.__module__)
    assert module in error_modules()
    assert getattr(module, cls.__name__) is cls


def test_codes_are_unique():
    codes = [cls.code for cls in CLASSES]
    duplicates = sorted({c for c in codes if codes.count(c) > 1})
    assert duplicates == []


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_code_is_well_formed_and_declared_on_the_class(cls):
    assert "code" in vars(cls), f"{cls.__name__} inherits its code"
    assert CODE_PATTERN.match(cls.code), cls.code


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_class_has_its_own_docstring(cls):
    doc = vars(cls).get("__doc__")
    assert doc and doc.strip()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_str_starts_with_the_code(cls):
    assert str(instantiate(cls)).startswith(f"{cls.code}: ")


@pytest.mark.parametrize("cls", [c for c in CLASSES if c is not JobCancelled], ids=lambda c: c.__name__)
def test_category_is_known(cls):
    assert cls.category in CATEGORIES


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_module_docstring_draws_every_class_with_its_code(cls):
    assert re.search(rf"\b{cls.__name__}\b", errors.__doc__)
    assert cls.code in errors.__doc__


def test_docstring_is_the_default_message():
    err = errors.LeaseOwnerMismatch()
    assert err.message == "The job's lease no longer belongs to this worker or has expired."
    assert (
        str(err)
        == "job.lease_owner_mismatch: The job's lease no longer belongs to this worker or has expired."
    )
    assert (
        str(errors.LeaseOwnerMismatch("job 1 is leased by w2"))
        == "job.lease_owner_mismatch: job 1 is leased by w2"
    )


def test_job_cancelled_escapes_except_exception():
    assert issubclass(JobCancelled, BaseException)
    assert not issubclass(JobCancelled, Exception)
    with pytest.raises(JobCancelled):
        try:
            raise JobCancelled("deadline")
        except Exception:  # noqa: BLE001 - the point: this must not catch it
            pytest.fail("except Exception swallowed JobCancelled")
    assert JobCancelled("deadline").reason == "deadline"
    assert str(JobCancelled("deadline")) == "job.cancelled: deadline"


def test_every_runledger_error_is_an_exception():
    for cls in CLASSES:
        if cls is not JobCancelled:
            assert issubclass(cls, RunledgerError) and issubclass(cls, Exception)


def test_config_error_keeps_its_problem_list():
    err = ConfigError(["a must be b, got c", "d must be e, got f"])
    assert err.problems == ["a must be b, got c", "d must be e, got f"]
    assert str(err) == "config.invalid: a must be b, got c; d must be e, got f"


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (errors.LeaseOwnerMismatch, "job.lease_owner_mismatch"),
        (errors.UnstartedClaimReleaseNotApplicable, "job.unstarted_claim_release_not_applicable"),
        (errors.InvalidCompletionProgress, "job.invalid_completion_progress"),
        (WorkflowReleaseConflict, "workflow.release_conflict"),
        (errors.DefinitionNotFoundOrDisabled, "job.definition_not_found_or_disabled"),
        (errors.InvalidPayload, "job.invalid_payload"),
        (errors.ConfigError, "config.invalid"),
        (errors.RegistrationError, "registry.invalid_registration"),
    ],
)
def test_spec_codes_are_pinned(cls, code):
    # The worker and operators branch on these exact strings (spec section 12).
    assert cls.code == code
