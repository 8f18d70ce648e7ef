"""Service configuration from one declarative key table per service.

A service describes each key once (:class:`Key`: RocketMQ's spelling, the dataclass field it
sets, how its text parses, its bounds or choices, a line of doc); its defaults are the
dataclass's own. :func:`load` reads, later sources winning:

1. the dataclass defaults;
2. a config file (Java properties: ``key=value`` lines, ``#``/``!`` comments);
3. environment variables ``ROCKETQ_<SERVICE>_<KEY>`` with a per-service prefix
   (``ROCKETQ_BROKER_BROKERNAME``, ``ROCKETQ_NAMESERVER_LISTENPORT``,
   ``ROCKETQ_TIMER_WHEEL_TIMERPRECISIONMS``; the key upper-cased, underscores ignored), so one
   environment never configures two services by accident;
4. ``--set key=value`` flags and the service's own command-line options.

Key names match case-insensitively and ignoring ``_``. A bad key or value raises
:class:`ConfigError` naming the key, where it came from, the (escaped, shortened) value and
what is allowed. This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

Parser = Callable[[str], Any]
T = TypeVar("T")

SHOWN_VALUE_MAX_CHARS = 60
"""A bad value is quoted in an error up to this many characters (a whole file would not help)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(ValueError):
    """A configuration key or value that cannot be used; the message says which and why."""


def parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_addrs(text: str) -> list[str]:
    """``host:port;host:port`` (``,`` also separates) to a list."""
    return [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]


def parse_path(text: str) -> Path:
    return Path(text).expanduser()


def show_value(text: str) -> str:
    """``text`` quoted with escapes, cut to :data:`SHOWN_VALUE_MAX_CHARS`."""
    shown = repr(text)
    if len(shown) > SHOWN_VALUE_MAX_CHARS:
        shown = shown[: SHOWN_VALUE_MAX_CHARS - 4] + "...'"
    return shown


@dataclass(frozen=True)
class Key:
    """One configuration key: its RocketMQ name, the field it sets and what it accepts."""

    name: str
    field: str
    parse: Parser = str
    doc: str = ""
    choices: tuple[str, ...] | None = None
    """Allowed values (after ``parse``)."""
    low: float | None = None
    high: float | None = None
    """Inclusive bounds of a number."""

    def allowed(self) -> str:
        """What this key accepts, in words (for error messages)."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        if self.low is not None and self.high is not None:
            return f"{self.low:g}..{self.high:g}"
        if self.low is not None:
            return f">= {self.low:g}"
        if self.high is not None:
            return f"<= {self.high:g}"
        return _KIND.get(self.parse, "text")

    def convert(self, text: str, source: str) -> Any:
        """The parsed value of ``text``; ConfigError naming key, source, value and what fits."""
        try:
            value = self.parse(text.strip())
        except ValueError as exc:
            # int()/float() quote the whole value again; a parser of ours says what is wrong.
            reason = "not a number" if self.parse in (int, float) else str(exc)[:100]
            raise self.error(text, source, reason) from None
        if self.choices is not None and value not in self.choices:
            raise self.error(text, source, "not allowed")
        if self._out_of_range(value):
            raise self.error(text, source, "out of range")
        return value

    def _out_of_range(self, value: object) -> bool:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        return (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        )

    def error(self, text: str, source: str, reason: str) -> ConfigError:
        return ConfigError(
            f"{self.name}={show_value(text)} ({source}): {reason}; allowed: {self.allowed()}"
        )


_KIND: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    parse_bool: "true or false",
    parse_addrs: "host:port;host:port",
    parse_path: "a path",
}


def log_level_key() -> Key:
    """``logLevel``: every service has it."""
    return Key("logLevel", "log_level", str.upper, "log level", choices=LOG_LEVELS)


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


Setting = tuple[str, str, str]
"""(canonical key, text, source) — one value from one source, in precedence order."""


class KeyTable:
    """A service's keys, and how its environment variables are named."""

    def __init__(self, service: str, keys: Iterable[Key]) -> None:
        self.service = service
        """As in messages ("broker", "nameserver", "timer-wheel") and the env prefix."""
        self.env_prefix = "ROCKETQ_" + service.upper().replace("-", "_") + "_"
        self.keys = {k.name: k for k in keys}
        self._by_norm = {_norm(k): k for k in self.keys}

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _norm(name) in self._by_norm

    def __getitem__(self, name: str) -> Key:
        return self.keys[self.canonical(name)]

    def canonical(self, name: str, source: str = "") -> str:
        """RocketMQ's spelling of ``name``; ConfigError listing the known keys otherwise."""
        found = self._by_norm.get(_norm(name))
        if found is None:
            where = f" ({source})" if source else ""
            raise ConfigError(
                f"unknown {self.service} key {name!r}{where}; known keys: "
                + ", ".join(sorted(self.keys))
            )
        return found

    def from_environment(self, environ: Mapping[str, str]) -> list[Setting]:
        """``ROCKETQ_<SERVICE>_<KEY>`` variables; an unknown key under the prefix is an error
        (a typo must not silently do nothing)."""
        out: list[Setting] = []
        for name, value in sorted(environ.items()):
            if name.startswith(self.env_prefix):
                source = f"environment {name}"
                out.append((self.canonical(name[len(self.env_prefix) :], source), value, source))
        return out

    def from_file(self, path: Path) -> list[Setting]:
        source = f"file {path}"
        return [(self.canonical(k, source), v, source) for k, v in read_properties(path).items()]

    def from_overrides(self, overrides: Mapping[str, str], source: str = "--set") -> list[Setting]:
        return [(self.canonical(k, source), v, source) for k, v in overrides.items()]

    def values(self, settings: Iterable[Setting]) -> dict[str, Any]:
        """Field name → parsed value of every setting; the last of a key wins."""
        out: dict[str, Any] = {}
        for key, text, source in settings:
            spec = self.keys[key]
            out[spec.field] = spec.convert(text, source)
        return out

    def apply(self, base: T, settings: Iterable[Setting], **extra: Any) -> T:
        """A copy of the dataclass ``base`` with every setting (and ``extra`` fields) in."""
        return dataclasses.replace(base, **self.values(settings), **extra)  # type: ignore[type-var]

    def as_properties(self, cfg: object) -> dict[str, str]:
        """Every key with its effective value as text."""
        return {key.name: format_value(getattr(cfg, key.field)) for key in self}


def format_value(value: object) -> str:
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_set_flags(items: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` (repeated ``--set``) to a dict; ConfigError on a missing ``=``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {show_value(item)}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def read_properties(path: Path) -> dict[str, str]:
    """Parse a Java-style properties file: ``key=value`` or ``key:value``, ``#``/``!`` comments."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {show_value(raw)}")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


def gather(
    table: KeyTable,
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Setting]:
    """Every setting from file, environment and overrides, lowest precedence first."""
    settings: list[Setting] = []
    if config_file is not None:
        settings += table.from_file(config_file)
    settings += table.from_environment(os.environ if environ is None else environ)
    settings += table.from_overrides(overrides or {})
    return settings


def load(
    table: KeyTable,
    base: T,
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """``base`` (the defaults) ← file ← environment ← overrides."""
    return table.apply(base, gather(table, config_file, overrides, environ))
