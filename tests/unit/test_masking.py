"""Every secret a libpq connection string can carry is masked in what the library prints.

URLs (``user:PASSWORD@`` and any secret-named query parameter) and libpq's
``key=value`` strings, quoted values too, alone (:func:`rl.mask_url`) or inside
free text (:func:`rl.mask_urls_in`).
"""

from __future__ import annotations

import pytest

import runledger_sync as rl

SECRET = "s3cr3t-4f1c"  # noqa: S105 - a marker to search for, not a credential


@pytest.mark.parametrize(("url", "masked"), [
    (f"postgresql://app:{SECRET}@db/app", "postgresql://app:***@db/app"),
    (f"postgresql://app@db/app?sslpassword={SECRET}", "postgresql://app@db/app?sslpassword=***"),
    (f"postgresql://app@db/app?sslmode=require&password={SECRET}&connect_timeout=5",
     "postgresql://app@db/app?sslmode=require&password=***&connect_timeout=5"),
    (f"postgresql://app@db/app?PASSWORD={SECRET}", "postgresql://app@db/app?PASSWORD=***"),
    (f"postgresql://app@db/app?api_token={SECRET}&client_secret={SECRET}",
     "postgresql://app@db/app?api_token=***&client_secret=***"),
    (f"postgresql://app:{SECRET}@db/app?sslpassword={SECRET}&sslmode=verify-full",
     "postgresql://app:***@db/app?sslpassword=***&sslmode=verify-full"),
    ("postgresql://app@db/app?sslmode=require&sslcert=/etc/cert.pem",    # nothing secret: left as given
     "postgresql://app@db/app?sslmode=require&sslcert=/etc/cert.pem"),
])
def test_mask_url_masks_the_userinfo_password_and_every_secret_query_parameter(url, masked):
    assert rl.mask_url(url) == masked
    assert rl.mask_urls_in(f"could not connect to {url}: refused") == f"could not connect to {masked}: refused"


@pytest.mark.parametrize(("conninfo", "masked"), [
    (f"host=db password={SECRET}", "host=db password=***"),
    (f"host=db sslpassword={SECRET} dbname=app", "host=db sslpassword=*** dbname=app"),
    (f"host=db password = {SECRET} user=app", "host=db password = *** user=app"),
    (f"host=db password='{SECRET} with spaces' user=app", "host=db password=*** user=app"),
    (f"host=db password='it\\'s {SECRET}' user=app", "host=db password=*** user=app"),   # an escaped quote inside
    (f"host=db Password={SECRET}", "host=db Password=***"),
    (f"dbname=app client_secret={SECRET} port=5432", "dbname=app client_secret=*** port=5432"),
    ("host=db dbname=app user=app", "host=db dbname=app user=app"),
])
def test_a_libpq_key_value_string_has_every_secret_value_masked(conninfo, masked):
    assert rl.mask_url(conninfo) == masked
    assert rl.mask_urls_in(f"connecting with {conninfo} failed") == f"connecting with {masked} failed"


def test_an_unclosed_quote_masks_the_rest_of_the_text():
    # libpq reads the value to the end of the string: no part of it may show.
    assert rl.mask_url(f"host=db password='{SECRET} never closed") == "host=db password=***"
    assert rl.mask_urls_in(f"bad conninfo: password='{SECRET} user=app") == "bad conninfo: password=***"


def test_masking_never_searches_the_rest_of_the_text_for_the_secret():
    text = "password authentication failed for user app: password=o host=db"
    assert rl.mask_urls_in(text) == "password authentication failed for user app: password=*** host=db"


def test_text_that_is_neither_a_url_nor_a_connection_string_is_not_shown():
    assert rl.mask_url(f"not a url {SECRET}") == "<unparseable url>"


def test_a_url_object_is_rendered_then_masked_alike():
    from sqlalchemy import make_url

    url = make_url(f"postgresql+psycopg2://app:{SECRET}@db/app?sslpassword={SECRET}")
    assert rl.mask_url(url) == "postgresql+psycopg2://app:***@db/app?sslpassword=***"
