"""The Django settings of the contrib tests; DATABASES is added by the test module's fixture."""

SETTINGS = {
    "SECRET_KEY": "runledger-tests-only",
    "INSTALLED_APPS": ["runledger_sync.contrib.django"],
    "USE_TZ": True,
    "RUNLEDGER": {
        "REGISTRY": "tests.db.contrib.django_jobs:registry",
        "CONFIG": {
            "poll_interval_ms": 20,
            "lease_ttl_seconds": 5,
            "heartbeat_interval_seconds": 0.5,
            "reaper_interval_seconds": 0.2,
        },
    },
}
