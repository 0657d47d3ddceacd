"""Slow clients against the default web server configuration (gunicorn.conf.py, as `gunicorn`
with no options would run it): while 50 clients dribble request headers and 10 dribble request
bodies (with a valid key), one byte per second each, /healthz keeps answering."""

import pytest

from tests.support.processes import Central
from tests.support.slow_clients import under_slow_clients


@pytest.mark.slow
def test_healthz_keeps_answering_while_60_clients_dribble_headers_and_bodies(transactional_db, site_key):
    with Central(workers=2) as central:
        report = under_slow_clients(central.port, header_clients=50, body_clients=10, key=site_key, seconds=10)
    assert report.probes >= 20
    assert report.ratio >= 0.95, f"{report.answered} of {report.probes} probes answered within 2 s"
