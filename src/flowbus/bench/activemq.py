"""ActiveMQ beside flowbus in one run: ``flowbus bench broker --baseline activemq`` (issue 18).

How it works:

* **The broker.** Debian's ``activemq`` package (5.17), installed by ``make test`` and
  ``make bench`` (:func:`ensure_installed` names the command when it is missing: library
  code installs no system package). :class:`ActiveMQ` runs its JVM directly
  (``java -jar /usr/share/activemq/bin/activemq.jar start xbean:file:...``) in a temporary
  directory of its own: its own ``activemq.xml``
  (``persistent="false"``, ``useJmx="false"``, no advisory topics, one STOMP transport connector on
  ``127.0.0.1`` port 0, nothing else), its own data and tmp directories, log4j to a file there.
  The port it got is read from its log (``Listening for connections at: stomp://...:PORT``).
  Nothing under ``/etc`` is read or changed and no system service is started. It runs in a
  process group of its own, stopped (``SIGTERM``, then ``SIGKILL``) when the ``with`` block ends,
  also on an error or Ctrl-C, and its directory is removed.
* **The selectors.** :func:`jms_selector` translates a flowbus filter (its canonical form) into
  JMS selector syntax: ``AND``/``OR``, ``=``, ``<>``, ordering, ``IN``, ``LIKE`` for prefix /
  suffix / contains, ``IS NOT NULL`` for ``exists``; a negated literal is ``(a IS NULL OR NOT
  (...))`` (flowbus: a negation holds on a missing attribute; JMS: unknown); in a conjunction
  equalities come first, then sets (ActiveMQ stops an AND at its first false). What JMS cannot say
  raises :class:`~flowbus.errors.FilterError`: expressions over attributes (``price * qty``),
  ordering of strings, integers beyond 2**53 (see below), names JMS or STOMP reserve.
* **Typed properties through STOMP.** Every STOMP header reaches ActiveMQ as a *string*
  property. ActiveMQ's STOMP transport parses every selector in its ``convert_string_expressions``
  mode (``ProtocolConverter`` prefixes it; adding the prefix again is a syntax error): a string
  property compared with a number literal is converted to the *literal's* type
  (``Long.valueOf`` for ``300``, ``Double.valueOf`` for ``300.0``). ``Long.valueOf("24.42")``
  fails and the comparison is false, so every number literal is written as a double (``300.0``):
  exact for integers up to 2**53, larger ones are refused. (The ``transformation`` header and its
  ``jms-map-json`` / ``jms-object-xml`` forms put the values in the *body* of a MapMessage or an
  ObjectMessage, where selectors do not look.) Events go out as headers
  (:data:`~flowbus.bench.stomp_clients.HEADERS`): strings as they are, numbers as Python writes
  them (``24.42``, ``1e-05``: both ``Double.valueOf`` text), booleans ``true`` / ``false``.
* **The run** (:func:`run`): the same events and filters as the flowbus rows, through the
  stomp.py program of :mod:`flowbus.bench.stomp_clients`, the one that also drives flowbus's
  brokers at their STOMP doors (``--protocol stomp``): ``clients`` subscriber connections,
  subscription ``i`` on connection ``i % clients`` (non-durable, ``ack: auto``), pipelined,
  receipts at the end; one publisher connection sends the events to one topic
  (``persistent: false``); ``events_per_s_in`` ends when every expected delivery has come and
  the last send's receipt too, as flowbus's figure ends when every matching subscriber's client
  has taken every event. ``deliveries_match_offline``: the deliveries each subscription got
  equal the offline evaluation the flowbus rows are checked against. ActiveMQ's JVM CPU while
  publishing is ``activemq_cpu_s``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.bench import stomp_clients
from flowbus.bench.stomp_clients import HEADERS, Progress, Target
from flowbus.bench.workloads import STOCK_PROBE_FILTER
from flowbus.errors import ExternalError, FilterError, UserError
from flowbus.filters import parse
from flowbus.filters.ast import Conjunction, ExprPredicate, Filter, Op, Predicate

HOME = Path("/usr/share/activemq")
JAR = HOME / "bin" / "activemq.jar"
TOPIC = "/topic/flowbus.bench"
HEAP = "1g"
SYSTEM = "ActiveMQ 5.17 (Debian's package), STOMP, stomp.py clients"

# ------------------------------------------------------------------------------ selectors

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_JMS_WORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
_STOMP_HEADERS = frozenset(
    {
        "destination", "receipt", "transaction", "persistent", "priority", "expires", "type",
        "timestamp", "redelivered", "transformation", "subscription", "selector", "ack", "id", "host",
        "login", "passcode", "version", "session", "server", "message",
        "t",  # the publisher's clock, added to every event here
    }
)  # fmt: skip
_ORDERING = {Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
_LIKE = {Op.PREFIX: "{}%", Op.SUFFIX: "%{}", Op.CONTAINS: "%{}%"}
_EXACT = 2**53
_FIRST = {Op.EQ: 0, Op.IN: 1}  # the order of a conjunction's literals (the others after them)


def jms_selector(f: Filter | str) -> str:
    """``f`` (a filter or its text) as a JMS selector ActiveMQ evaluates as flowbus does on events
    sent by :func:`~flowbus.bench.stomp_clients.event_headers` (see the module note); a
    :class:`FilterError` naming the part JMS cannot say."""
    flt = parse(f) if isinstance(f, str) else f
    if not flt.disjuncts:
        return "FALSE"
    parts = [_conjunction(c) for c in flt.disjuncts]
    return parts[0] if len(parts) == 1 else " OR ".join(f"({p})" for p in parts)


def _conjunction(c: Conjunction) -> str:
    """The literals joined by AND, equalities first, then sets: ActiveMQ evaluates an AND from the
    left and stops at the first false, and ``symbol = 'S1'`` is the cheapest and most selective."""
    if not c.literals:
        return "TRUE"
    first = sorted(c.literals, key=lambda lit: _FIRST.get(lit.op, len(_FIRST)) + lit.negated * len(_FIRST))
    return " AND ".join(_literal(lit) for lit in first)


def _literal(lit: Predicate | ExprPredicate) -> str:
    if isinstance(lit, ExprPredicate):
        raise FilterError(
            f"JMS selectors cannot say {lit!r}: through STOMP every property is text, and ActiveMQ "
            "converts text to a number only where it is compared with a literal"
        )
    name = _name(lit.attr)
    if lit.op is Op.EXISTS:
        return f"{name} IS NULL" if lit.negated else f"{name} IS NOT NULL"
    text = _predicate(name, lit)
    return f"({name} IS NULL OR NOT ({text}))" if lit.negated else text


def _predicate(name: str, lit: Predicate) -> str:
    op, value = lit.op, lit.value
    if op is Op.EQ or op is Op.NE:
        return f"{name} {'=' if op is Op.EQ else '<>'} {_constant(value, lit)}"
    if op in _ORDERING:
        if isinstance(value, str):
            raise FilterError(f"JMS selectors order numbers only, not strings: {lit.attr} {op} {value!r}")
        return f"{name} {_ORDERING[op]} {_constant(value, lit)}"
    if op in _LIKE:
        assert isinstance(value, str)  # (the canonical form checks it)
        pattern = _LIKE[op].format(re.sub(r"([!%_])", r"!\1", value))
        return f"{name} LIKE {_constant(pattern, lit)} ESCAPE '!'"
    assert op is Op.IN or op is Op.NOT_IN, op
    members = value if isinstance(value, tuple) else (value,)
    if not members:
        raise FilterError(f"JMS selectors have no empty set: {lit.attr} {op} {{}}")
    listed = ", ".join(_constant(m, lit) for m in members)
    if all(isinstance(m, str) for m in members):  # JMS's IN takes strings only
        return f"{name} {'IN' if op is Op.IN else 'NOT IN'} ({listed})"
    join, cmp = (" OR ", "=") if op is Op.IN else (" AND ", "<>")
    return "(" + join.join(f"{name} {cmp} {_constant(m, lit)}" for m in members) + ")"


def _name(attr: str) -> str:
    if (
        not _IDENTIFIER.fullmatch(attr)
        or attr.upper() in _JMS_WORDS
        or attr.upper().startswith("JMS")
        or attr in _STOMP_HEADERS
    ):
        raise FilterError(
            f"attribute {attr!r} cannot be a JMS selector's property sent as a STOMP header "
            "(a Java identifier, not a JMS word, not JMS*, not a STOMP header)"
        )
    return attr


def _constant(value: object, lit: Predicate) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int) and abs(value) > _EXACT:
        raise FilterError(f"{lit.attr}: {value} is beyond 2**53: ActiveMQ compares it as a double")
    if isinstance(value, int | float):
        text = repr(float(value)).upper()  # a double literal: '300.0', '1E-05', '1E+16'
        mantissa, e, exponent = text.partition("E")
        return (mantissa if "." in mantissa else mantissa + ".0") + e + exponent
    raise FilterError(f"{lit.attr}: constant {value!r} has no JMS literal")


# ------------------------------------------------------------------------------ the broker


def ensure_installed() -> Path:
    """The package's ``activemq.jar``; an :class:`ExternalError` naming the command that
    installs it when it is missing."""
    if JAR.is_file():
        return JAR
    raise ExternalError(
        f"ActiveMQ is not installed ({JAR} is missing): run `apt-get install -y activemq` as root "
        "(Debian's package; `make test` and `make bench` do it)"
    )


_CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="flowbus-bench"
          persistent="false" useJmx="false" advisorySupport="false" dataDirectory="{data}">
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:0"/>
    </transportConnectors>
  </broker>
</beans>
"""
_LOG4J = """log4j.rootLogger=WARN, file
log4j.logger.org.apache.activemq.broker.BrokerService=INFO
log4j.logger.org.apache.activemq.transport.TransportServerThreadSupport=INFO
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %p %c{{1}} %m%n
"""
_LISTENING = re.compile(r"Listening for connections at: stomp://[^:/\s]+:(\d+)")


class ActiveMQ:
    """One ActiveMQ broker of our own (see the module note): ``with ActiveMQ() as amq:`` serves
    STOMP on ``127.0.0.1:amq.port`` inside the block."""

    def __init__(self, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None

    def __enter__(self) -> ActiveMQ:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        jar = ensure_installed()
        java = shutil.which("java")
        if java is None:
            raise UserError("`java` is not on PATH (Debian's activemq package depends on a JRE)")
        d = self.dir = Path(tempfile.mkdtemp(prefix="flowbus-activemq-"))
        for sub in ("conf", "data", "tmp"):
            (d / sub).mkdir()
        (d / "conf" / "activemq.xml").write_text(_CONFIG.format(data=d / "data"))
        log4j = d / "conf" / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=d / "activemq.log"))
        cmd = [
            java, f"-Xms{HEAP}", f"-Xmx{HEAP}", f"-Dlog4j.configuration=file:{log4j}",
            f"-Dactivemq.home={HOME}", f"-Dactivemq.base={d}", f"-Dactivemq.conf={d / 'conf'}",
            f"-Dactivemq.data={d / 'data'}", f"-Djava.io.tmpdir={d / 'tmp'}",
            "-jar", str(jar), "start", f"xbean:file:{d / 'conf' / 'activemq.xml'}",
        ]  # fmt: skip
        with open(d / "stdout.log", "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.port = self._wait_listening(d / "activemq.log")

    def _wait_listening(self, log: Path) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            port = _LISTENING.search(text)
            if port and ") started" in text:
                return int(port.group(1))
            if self.proc.poll() is not None:
                raise ExternalError(
                    f"ActiveMQ exited ({self.proc.returncode}) while starting: {self.log_tail()}"
                )
            time.sleep(0.1)
        raise ExternalError(f"ActiveMQ not listening after {self.startup_timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the broker's log and its standard output."""
        if self.dir is None:
            return ""
        texts = [(self.dir / n).read_text(errors="replace") for n in ("activemq.log", "stdout.log")]
        return " | ".join(t[-chars:] for t in texts if t)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """Stop the JVM's process group (SIGTERM, SIGKILL after 20 s) and remove the directory."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# ------------------------------------------------------------------------------ the run


def run(
    filters: Sequence[str], events: Sequence[dict[str, Any]], expected: np.ndarray, *, clients: int = 4,
    progress: Progress | None = None, subscribe_timeout: float = 900.0, stall_s: float = 30.0,
) -> dict[str, Any]:  # fmt: skip
    """The same workload through a fresh ActiveMQ, driven by :func:`flowbus.bench.stomp_clients.run`
    (see the module note): its figures, or what was measured and ``error`` (the traceback) when
    it failed."""
    out: dict[str, Any] = {"system": SYSTEM}
    try:
        selectors = [jms_selector(f) for f in filters]  # (what JMS cannot say fails before a JVM starts)
        probe = jms_selector(STOCK_PROBE_FILTER)
        with ActiveMQ() as amq:
            target = Target(
                "ActiveMQ", [("127.0.0.1", amq.port)], TOPIC, HEADERS, [amq.pid], cpu_field="activemq_cpu_s"
            )
            stomp_clients.run(
                target, selectors, probe, events, expected, out, clients=clients, progress=progress,
                subscribe_timeout=subscribe_timeout, stall_s=stall_s,
            )  # fmt: skip
    except Exception:
        out["error"] = traceback.format_exc()
        out["deliveries_match_offline"] = False
    return out


def add_to_rows(
    rows: list[dict[str, Any]], filters: Sequence[str], events: Sequence[dict[str, Any]],
    expected: np.ndarray, *, clients: int, progress: Progress | None = None,
) -> None:  # fmt: skip
    """:func:`run` on a K's workload, beside each of the K's flowbus ``rows``: ``activemq_events_per_s_in``,
    ``ratio_to_activemq`` (the row's events/s in over ActiveMQ's) and ``activemq``, its figures."""
    baseline = run(filters, events, expected, clients=clients, progress=progress)
    theirs = baseline.get("events_per_s_in")
    for row in rows:
        ours = row.get("events_per_s_in")
        row["activemq_events_per_s_in"] = theirs
        row["ratio_to_activemq"] = ours / theirs if ours and theirs else None
        row["activemq"] = baseline
