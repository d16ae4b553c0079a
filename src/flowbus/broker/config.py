"""A broker's configuration: its information spaces, collapse rule sets and limits.

A YAML file (``flowbus broker start --config FILE``)::

    spaces:
      stocks: {symbol: str, price: float, quantity: int, exchange: str, level: int}
      anything: null            # no schema: any event
    rulesets:                   # collapse rule sets a subscription may name
      last_price: ...           # the flow specs' collapse syntax (docs/flow.md)
    backup: 2                   # ring neighbours holding each broker's subscriptions
    heartbeat: 2.0              # seconds between ring heartbeats
    window: 500                 # deliveries in flight to one subscriber, unacknowledged
    memory: 2000                # deliveries per subscription held in memory (in flight
                                # included); the rest go to SQLite. Keep it below the
                                # clients' publish window (10,000 by default).
    linger: 30.0                # seconds a non-durable subscription outlives its connection
    step_interval: 0.005        # seconds between two reads of a publishing client connection:
                                # each read takes what arrived meanwhile, so a steady stream
                                # of publishes goes to the core in fewer, larger steps; a
                                # connection quiet for longer is read at once
    keepalive: 1.0              # seconds: a client connection the broker wrote nothing to
                                # for this long is sent a keepalive frame (clients drop a
                                # broker they hear nothing from for their idle_timeout)
    backlog_wait: 300.0         # seconds a subscription taken over waits for the part of its
                                # queue on its former broker's disk (that broker back as a
                                # new member hands it over); then what is here is served
    sync: full                  # the store's commits synced to the disk (full), or not
                                # (normal: faster, but a power loss may take the last
                                # ones back; a process crash never does; docs/guarantees.md)
    advertising: false          # publishers advertise first; subscriptions are forwarded
                                # only towards brokers with an overlapping advertisement
    memory_limit: null          # MB of resident memory past which the broker refuses new
                                # subscriptions ("out of memory for subscriptions"), each
                                # counted at about 4 KB and its filter's text (null: none)
    load_limit: null            # ring state entries (subscriptions...) a broker holds before
    rate_limit: null            # ... or events a second it routes before it is over its
                                # limit and asks for another broker (``cluster up
                                # --max-brokers``; docs/overlay.md, "Load")
    acl:                        # rights per identity on space patterns (docs/security.md);
      alice: {publish: [stocks], subscribe: ["*"], deploy: ["*"]}   # none: all may do all
    tokens: {bob: "sha256:..."} # identities by token: only the hash (flowbus certs token)
    revoked: [mallory]          # client certificates (names or serials) refused
    classes: {vault: secure}    # spaces (patterns) routed only over mutual-TLS links;
                                # {alerts: express}: only over links whose latency,
    express_bound: 0.05         # measured from the heartbeats, is at most this (seconds)
    stomp: 127.0.0.1:61613      # a STOMP 1.2 listener too (broker/stomp.py; port 0: any
                                # free port; --stomp on the command line wins)
    security:                   # the door (net/admission.py)
      handshake_timeout: 10.0   # seconds for the TLS handshake and the first frame
      per_address: null         # connections open at once from one source address
      plain_peers: false        # with --tls, also take plain-text peers (plain links)

Without a file, :data:`DEFAULT` serves the stock-exchange space of the examples and a
schemaless ``events`` space.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from flowbus.broker.acl import Acl
from flowbus.errors import ConfigError, SchemaError
from flowbus.model import Schema

__all__ = ["DEFAULT", "BrokerConfig", "ConfigError", "parse_address"]


STOCKS = Schema.of({"symbol": "str", "price": "float", "quantity": "int", "exchange": "str", "level": "int"})

_LIMITS = (
    "backup",
    "heartbeat",
    "window",
    "memory",
    "linger",
    "step_interval",
    "keepalive",
    "sync",
    "backlog_wait",
    "advertising",
    "memory_limit",
    "load_limit",
    "rate_limit",
    "express_bound",
    "stomp",
)
_SECURITY = {"handshake_timeout": 10.0, "per_address": None, "plain_peers": False}


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``, or a :class:`ConfigError` naming the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"an address is HOST:PORT, got {text!r}")
    return host, int(port)


CLASSES = ("normal", "secure", "express")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    spaces: Mapping[str, Schema | None] = field(default_factory=lambda: {"stocks": STOCKS, "events": None})
    rulesets: Mapping[str, Any] = field(default_factory=dict)
    backup: int = 2
    heartbeat: float = 2.0
    window: int = 500
    memory: int = 2000
    linger: float = 30.0
    step_interval: float = 0.005  # seconds between two reads of a publishing client connection
    keepalive: float = 1.0  # seconds: a client connection written nothing for this long gets a keepalive
    sync: str = "full"  # the store's syncing: full (each commit on the disk) or normal (broker/store.py)
    backlog_wait: float = 300.0  # seconds a taken-over subscription waits for its former broker's backlog
    advertising: bool = False
    memory_limit: int | None = None  # MB of resident memory past which new subscriptions are refused
    load_limit: int | None = None
    rate_limit: float | None = None
    express_bound: float = 0.05  # seconds: the latency an express space's links may have
    stomp: str | None = None  # HOST:PORT of a STOMP listener (None: none; broker/stomp.py)
    acl: Acl = field(default_factory=Acl)
    classes: Mapping[str, str] = field(default_factory=dict)  # space pattern -> class
    security: Mapping[str, Any] = field(default_factory=lambda: dict(_SECURITY))

    def __post_init__(self) -> None:
        if self.memory_limit is not None and (type(self.memory_limit) is not int or self.memory_limit < 1):
            raise ConfigError(f"memory_limit: an int >= 1 (MB) or null, got {self.memory_limit!r}")
        if self.load_limit is not None and (type(self.load_limit) is not int or self.load_limit < 1):
            raise ConfigError(f"load_limit: an int >= 1 (state entries) or null, got {self.load_limit!r}")
        if self.rate_limit is not None and (
            not isinstance(self.rate_limit, int | float)
            or isinstance(self.rate_limit, bool)
            or self.rate_limit <= 0
        ):
            raise ConfigError(f"rate_limit: a number > 0 (events a second) or null, got {self.rate_limit!r}")
        if isinstance(self.express_bound, bool) or not isinstance(self.express_bound, int | float):
            raise ConfigError(f"express_bound: seconds > 0, got {self.express_bound!r}")
        if not self.express_bound > 0:
            raise ConfigError(f"express_bound: seconds > 0, got {self.express_bound!r}")
        if self.stomp is not None:
            try:
                parse_address(self.stomp if isinstance(self.stomp, str) else repr(self.stomp))
            except ConfigError:
                raise ConfigError(f"stomp: HOST:PORT of the STOMP listener, got {self.stomp!r}") from None
        if not isinstance(self.advertising, bool):
            raise ConfigError(f"advertising: true or false, got {self.advertising!r}")
        if not self.spaces:
            raise ConfigError("spaces: at least one space is needed")
        for name in self.spaces:
            if not isinstance(name, str) or not name or len(name) > 200:
                raise ConfigError(f"spaces: bad space name {name!r}")
        if not 1 <= self.backup <= 4:
            raise ConfigError(f"backup: 1..4 ring neighbours, got {self.backup!r}")
        if isinstance(self.step_interval, bool) or not isinstance(self.step_interval, int | float):
            raise ConfigError(f"step_interval: seconds >= 0 (0: read at once), got {self.step_interval!r}")
        if not 0 <= self.step_interval <= 1:
            raise ConfigError(f"step_interval: seconds from 0 to 1, got {self.step_interval!r}")
        if (
            isinstance(self.keepalive, bool)
            or not isinstance(self.keepalive, int | float)
            or not self.keepalive > 0
        ):
            raise ConfigError(f"keepalive: seconds > 0, got {self.keepalive!r}")
        if isinstance(self.backlog_wait, bool) or not isinstance(self.backlog_wait, int | float):
            raise ConfigError(f"backlog_wait: seconds >= 0, got {self.backlog_wait!r}")
        if not self.backlog_wait >= 0:
            raise ConfigError(f"backlog_wait: seconds >= 0, got {self.backlog_wait!r}")
        if self.sync not in ("full", "normal"):
            raise ConfigError(f"sync: full or normal, got {self.sync!r}")
        if not self.heartbeat > 0 or not self.linger >= 0:
            raise ConfigError(f"heartbeat > 0 and linger >= 0, got {self.heartbeat!r}, {self.linger!r}")
        if self.window < 1 or self.memory < 1:
            raise ConfigError(f"window and memory are >= 1, got {self.window!r}, {self.memory!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> BrokerConfig:
        known = ("spaces", "rulesets", *_LIMITS, "acl", "tokens", "revoked", "classes", "security")
        unknown = set(data) - set(known)
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)} (known: {', '.join(known)})")
        kw: dict[str, Any] = {k: data[k] for k in _LIMITS if k in data}
        kw["acl"] = Acl.from_config(data.get("acl"), data.get("tokens"), data.get("revoked"))
        kw["classes"] = _classes(data.get("classes"))
        kw["security"] = _security(data.get("security"))
        if "spaces" in data:
            spaces = data["spaces"]
            if not isinstance(spaces, Mapping):
                raise ConfigError("spaces: a mapping of space name -> schema (or null)")
            try:
                kw["spaces"] = {n: None if f is None else Schema.of(f) for n, f in spaces.items()}
            except (SchemaError, AttributeError, TypeError) as e:
                raise ConfigError(f"spaces: {e}") from None
        if "rulesets" in data:
            if not isinstance(data["rulesets"], Mapping):
                raise ConfigError("rulesets: a mapping of rule set name -> collapse rules")
            kw["rulesets"] = dict(data["rulesets"])
        try:
            return cls(**kw)
        except TypeError as e:
            raise ConfigError(str(e)) from None

    @classmethod
    def load(cls, path: Path | str) -> BrokerConfig:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: {e}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: a mapping of settings is expected")
        return cls.from_mapping(data)

    def with_(self, **changes: Any) -> BrokerConfig:
        return replace(self, **changes)

    def secure(self, space: str) -> bool:
        """Whether ``space`` is of class ``secure`` (routed over mutual-TLS links only)."""
        return any(c == "secure" and fnmatch.fnmatchcase(space, p) for p, c in self.classes.items())

    def express(self, space: Any) -> bool:
        """Whether ``space`` is of class ``express`` (over links within ``express_bound`` only)."""
        return isinstance(space, str) and any(
            c == "express" and fnmatch.fnmatchcase(space, p) for p, c in self.classes.items()
        )

    def schemas(self) -> dict[str, dict[str, str] | None]:
        """The spaces as the client protocol's ``Welcome`` lists them."""
        return {n: None if s is None else s.to_dict() for n, s in self.spaces.items()}


def _classes(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and v in CLASSES for k, v in value.items()
    ):
        raise ConfigError(f"classes: a mapping of space pattern -> {' or '.join(CLASSES)}, got {value!r}")
    return dict(value)


def _security(value: Any) -> dict[str, Any]:
    if value is None:
        return dict(_SECURITY)
    if not isinstance(value, Mapping) or set(value) - set(_SECURITY):
        raise ConfigError(f"security: a mapping with keys among {', '.join(_SECURITY)}, got {value!r}")
    out = {**_SECURITY, **value}
    timeout, cap = out["handshake_timeout"], out["per_address"]
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise ConfigError(f"security.handshake_timeout: seconds > 0, got {timeout!r}")
    if cap is not None and (type(cap) is not int or cap < 1):
        raise ConfigError(f"security.per_address: an int >= 1 or null, got {cap!r}")
    if not isinstance(out["plain_peers"], bool):
        raise ConfigError(f"security.plain_peers: true or false, got {out['plain_peers']!r}")
    return out


DEFAULT = BrokerConfig()
