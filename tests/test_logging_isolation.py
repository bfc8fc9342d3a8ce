"""The root conftest gives every test the logging state it started with (tests run in file order)."""

from __future__ import annotations

import io

import structlog

from exporter import log

_LEAK_KEY = ("test_logging_isolation", "leak")
_stream = io.StringIO()


def test_a_test_that_configures_logging_and_logs_once() -> None:
    log.configure("error", "logfmt", stream=_stream)
    assert log.once(_LEAK_KEY)
    log.get_logger().error("isolation_probe")
    assert "isolation_probe" in _stream.getvalue()


def test_the_next_test_does_not_inherit_that_level_stream_or_once_key() -> None:
    _stream.truncate(0)
    _stream.seek(0)
    log.get_logger().error("after_probe")
    assert _stream.getvalue() == "", "logging still writes to the previous test's stream"
    assert structlog.get_config()["wrapper_class"] is not structlog.make_filtering_bound_logger(40)
    assert log.once(_LEAK_KEY), "a log.once key set by the previous test leaked"
