"""What a failed page's reason may show a client: no internal host names, addresses or SQL
(``paperlane.errors.redact``), in the forms the drivers and clients paperlane uses write them."""

from __future__ import annotations

import pytest

from paperlane.errors import REDACTED, redact


@pytest.mark.parametrize("text, secret", [
    ('connection to server at "pg.internal" (10.0.0.5), port 5432 failed', "pg.internal"),
    ('could not translate host name "pg.internal" to address: Name or service not known', "pg.internal"),
    ("Error 111 connecting to redis-master.svc:6379. Connection refused.", "redis-master"),
    ("Could not connect to the endpoint URL: http://weed.internal:8333/paperlane/k", "weed.internal"),
    ("connect to [fd00::5]:5432 refused", "fd00::5"),
    ("timed out talking to 10.1.2.3", "10.1.2.3"),
    ("(psycopg2.OperationalError) deadlock [SQL: SELECT secret FROM keys WHERE id = %(id)s]", "secret"),
])
def test_a_reason_names_no_internal_place_and_no_sql(text: str, secret: str) -> None:
    shown = redact(text)
    assert secret not in shown, shown
    assert shown  # something readable is left


def test_what_the_caller_sent_stays() -> None:
    reason = "s3://inbox/acme/a.pdf: PDF page 3 holds an image too large (40000x40000 = 1600 MP, limit 150 MP)"
    assert redact(reason) == reason
    assert REDACTED not in redact("page 2 of 1 requested")
