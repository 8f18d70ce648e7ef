"""Start RocketQ's own services on loopback for tests and benchmarks, through the supervisor.

Each service listens on ``host`` port 0 and reports its address through its ready file, so
callers never guess ports. Data and the log of service ``NAME`` live in ``ROOT/NAME``. Brokers
get small files (64 MiB commitlog files), which keep test and benchmark directories small;
every RocketMQ key can be overridden through ``keys``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from services.common import supervisor
from services.common.supervisor import Process

SMALL_BROKER_KEYS: dict[str, object] = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
    "mappedFileUnitsConsumeQueue": 30_000,
    "registerNameServerPeriod": 2000,
}


def set_flags(keys: Mapping[str, object]) -> list[str]:
    """``--set key=value`` for each key (booleans as true/false)."""
    out: list[str] = []
    for key, value in keys.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def start_nameserver(
    root: Path,
    *args: str,
    name: str = "namesrv",
    host: str = "127.0.0.1",
    prefix: list[str] | None = None,
) -> Process:
    """A nameserver on ``host`` port 0; ``prefix`` (``ip netns exec NS``): see supervisor."""
    return supervisor.spawn(
        name, "services.nameserver", ["--listen", f"{host}:0", *args], root / name, prefix=prefix
    )


def broker_args(
    store_dir: Path, namesrv_addrs: list[str], name: str, config_keys: Mapping[str, object]
) -> list[str]:
    """The flags of broker ``name`` on 127.0.0.1 port 0 with small files, its RocketMQ 5 gateway
    off (``gatewayPort=0``: its default 8081 would clash between brokers on one host; give
    each its own port to serve it); ``config_keys`` (RocketMQ key names) win."""
    keys: dict[str, object] = {
        "brokerName": name,
        "listenAddress": "127.0.0.1",
        "listenPort": 0,
        "gatewayPort": 0,
        "brokerIP1": "127.0.0.1",
        "namesrvAddr": ";".join(namesrv_addrs),
        "storePathRootDir": store_dir,
        **SMALL_BROKER_KEYS,
    }
    keys.update(config_keys)
    return set_flags(keys)


def start_broker(
    root: Path,
    namesrv_addrs: list[str],
    name: str = "broker-a",
    keys: Mapping[str, object] | None = None,
    *,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    workdir_name: str = "",
) -> Process:
    """A broker with config ``keys`` (store in ``ROOT/NAME/store`` unless
    ``storePathRootDir`` is given); ``workdir_name`` names its directory and process if not
    ``name`` (a slave's)."""
    label = workdir_name or name
    workdir = root / label
    config_keys = dict(keys or {})
    store_dir = Path(str(config_keys.pop("storePathRootDir", workdir / "store")))
    args = broker_args(store_dir, namesrv_addrs, name, config_keys)
    return supervisor.spawn(label, "services.broker", args, workdir, env=env, prefix=prefix)


def start_timer_wheel(
    root: Path,
    namesrv_addrs: list[str],
    name: str = "timer-0",
    keys: Mapping[str, object] | None = None,
    *,
    env: dict[str, str] | None = None,
) -> Process:
    """A timer-wheel (data in ``ROOT/NAME/data``); ``keys`` as ``--set key=value``."""
    workdir = root / name
    args = ["--namesrv", ";".join(namesrv_addrs), "--data-dir", str(workdir / "data")]
    args += ["--listen", "127.0.0.1:0", *set_flags(keys or {})]
    return supervisor.spawn(name, "services.timer_wheel", args, workdir, env=env)
