"""The Django settings of the contrib tests; DATABASES is added by the test module's fixture."""

SETTINGS = {
    "SECRET_KEY": "runledger-tests-only",
    "INSTALLED_APPS": ["runledger_sync.contrib.django"],
    "USE_TZ": True,
    "ALLOWED_HOSTS": ["testserver"],
    "ROOT_URLCONF": "tests.db.contrib.django_urls",
    "MIDDLEWARE": ["tests.db.contrib.django_users.header_user"],
    "LOGIN_URL": "/accounts/login/",
    "RUNLEDGER": {
        "REGISTRY": "tests.db.contrib.django_jobs:registry",
        "DASHBOARD": {"READ_ONLY": False, "AUTHORIZE": "tests.db.contrib.django_jobs:dashboard_operator"},
        "CONFIG": {
            "poll_interval_ms": 20,
            "lease_ttl_seconds": 5,
            "heartbeat_interval_seconds": 0.5,
            "reaper_interval_seconds": 0.2,
        },
    },
}
