"""services.common's skeleton: config precedence and errors, one environment per service, the
JSON log line."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from services.broker import config as broker_config
from services.common import logs
from services.common.config import ConfigError
from services.nameserver import config as ns_config
from services.timer_wheel import config as timer_config


def test_sources_in_precedence_order(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=from-file\nbrokerClusterName=file-cluster\nlistenPort=1\n")
    env = {"ROCKETQ_BROKER_BROKERNAME": "from-env", "ROCKETQ_BROKER_LISTEN_PORT": "2"}
    cfg = broker_config.load(conf, {"listenPort": "3"}, env)
    assert (cfg.cluster_name, cfg.broker_name, cfg.listen_port) == ("file-cluster", "from-env", 3)


def test_each_service_reads_only_its_own_environment() -> None:
    env = {
        "ROCKETQ_NAMESERVER_LISTENPORT": "9001",
        "ROCKETQ_BROKER_LISTENPORT": "9002",
        "ROCKETQ_TIMER_WHEEL_LISTENPORT": "9003",
        "ROCKETQ_LISTENPORT": "1",  # the old shared name configures nobody
    }
    assert ns_config.load(None, {}, env).listen_port == 9001
    assert broker_config.load(None, {}, env).listen_port == 9002
    assert timer_config.load({}, env).listen_port == 9003


def test_errors_name_key_source_value_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as bad:
        ns_config.load(None, {}, {"ROCKETQ_NAMESERVER_LISTENPORT": "x" * 500})
    text = str(bad.value)
    assert "listenPort=" in text and "ROCKETQ_NAMESERVER_LISTENPORT" in text
    assert "0..65535" in text and len(text) < 200
    with pytest.raises(ConfigError, match=r"logLevel='loud' \(--set\).*one of DEBUG"):
        broker_config.load(None, {"logLevel": "loud"}, {})
    with pytest.raises(ConfigError, match="unknown nameserver key 'NAME'"):
        ns_config.load(None, {}, {"ROCKETQ_NAMESERVER_NAME": "x"})


def test_a_log_line_is_json_with_the_service_context() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("broker", "INFO", stream=out, json_lines=True, broker="broker-a")
        logging.getLogger("services.x").warning("disk %d%% full", 91)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    line = json.loads(out.getvalue().splitlines()[-1])
    assert line["event"] == "disk 91% full" and line["level"] == "WARNING"
    assert line["service"] == "broker" and line["broker"] == "broker-a" and line["pid"] > 0
