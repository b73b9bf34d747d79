"""Settings of the example project: one PostgreSQL database holds the orders and the job queue."""

import os
from urllib.parse import parse_qsl, unquote, urlsplit


def database_from_url(url: str) -> dict:
    """A DATABASES entry for postgresql://user:password@host:port/name?sslmode=...

    A ``host`` in the query string (a Unix socket directory) wins over the one in the netloc.
    """
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": options.pop("host", parts.hostname or ""),
        "PORT": options.pop("port", str(parts.port or "")),
        "OPTIONS": options,
    }


DATABASE_URL = os.environ.get("RUNLEDGER_DATABASE_URL") or os.environ.get("DATABASE_URL")
if not DATABASE_URL:
    raise RuntimeError("set RUNLEDGER_DATABASE_URL (or DATABASE_URL) to a PostgreSQL URL")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-set-DJANGO_SECRET_KEY-in-production")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
ROOT_URLCONF = "project.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]

DATABASES = {"default": database_from_url(DATABASE_URL)}
INSTALLED_APPS = ["runledger_sync.contrib.django", "shop"]
RUNLEDGER = {"REGISTRY": "shop.jobs:registry", "CONFIG": {"max_global_concurrency": 8}}
