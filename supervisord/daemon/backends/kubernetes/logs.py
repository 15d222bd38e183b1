"""Following the leader pod's log, exactly once (docs/kubernetes.md, "While it runs").

The log is read through ``pods/log`` with ``timestamps=true``, so each line
arrives as ``<RFC 3339 timestamp> <text>``. Every recorded line gets the
position ``"<timestamp>#<n>"`` where ``n`` counts the lines already seen
with that same timestamp; positions are recorded per source
``"<pod>/<container>"`` and the store ignores a position it already has.

The cursor is the newest recorded position: (timestamp T, n). A reconnect
asks for ``sinceTime=T`` (the API server passes it to the kubelet in whole
seconds, so the replay starts at the second of T and holds *every* line
with timestamp T); the replayed lines before T, and the first n+1 lines at
T, are skipped. Because positions count lines from the first one with a
timestamp, a replay gives every line the same position it had: no line is
lost or doubled, and the whole log is never read again.

A follow is resumed after: the connection dropping, an end of stream while
the container still runs, a stall (no byte for ``stall_s`` seconds although
the log has lines past the cursor, which a short non-follow read checks; a
quiet container keeps its stream, and the check's wait doubles up to
``stall_max_s``, so it costs one small request every few minutes), and log
rotation (a follow stream stays on the rotated file and goes silent: a
stall; the new request reads the new file). ``400 ... is
waiting to start`` is retried. Once the container has terminated, one final
read (bounded in time) picks up the rest, including a last line without a
newline, and the follower ends. Phases never come from here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from store import split_text
from supervisord.daemon.backends.base import RunReporter
from supervisord.daemon.backends.kubernetes.client.access import Cluster, is_transient
from supervisord.daemon.backends.kubernetes.client.errors import BadRequestError, KubernetesApiError, NotFoundError

__all__ = ["ContainerState", "LogCursor", "LogDecoder", "LogFollower", "parse_timestamp"]

log = structlog.get_logger("jobsup.kubernetes.logs")

#: What the follower needs to know of the container: "waiting", "running",
#: "terminated" (or the pod finished) or "gone" (the pod was deleted).
ContainerState = str

_TS = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


def parse_timestamp(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 timestamp with up to nine
    fraction digits (``2026-01-02T03:04:05.123456789Z``, ``…+02:00``).
    Raises ValueError when ``text`` is not one."""
    m = _TS.match(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    base, frac, zone = m.groups()
    moment = dt.datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return int(moment.timestamp()) * 1_000_000_000 + int((frac or "").ljust(9, "0"))


@dataclasses.dataclass(frozen=True)
class LogCursor:
    """The newest recorded line: its timestamp (text and nanoseconds) and its
    count ``n`` among lines with that timestamp (``pos == f"{ts}#{n}"``)."""

    ts: str
    ts_ns: int
    n: int

    @classmethod
    def parse(cls, pos: str | None) -> LogCursor | None:
        """The cursor of a recorded position, None for None. Raises
        ValueError for a position not of the form ``"<timestamp>#<n>"``."""
        if pos is None:
            return None
        ts, sep, n = pos.rpartition("#")
        # "<ts>#<n>/<k>" is piece k of a line longer than MAX_LINE_BYTES.
        n = n.partition("/")[0]
        if not sep or not n.isdigit():
            raise ValueError(f"log position {pos!r} is not <timestamp>#<n>")
        return cls(ts, parse_timestamp(ts), int(n))

    def since_time(self) -> str:
        """``sinceTime`` for a reconnect: T truncated to whole seconds, UTC."""
        seconds = self.ts_ns // 1_000_000_000
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LogDecoder:
    """Turns one response body of ``pods/log?timestamps=true`` into
    ``(pos, text)`` lines to record, skipping what ``cursor`` says was
    recorded. Feed bytes with :meth:`feed`; :meth:`finish` returns a last
    line without a newline (only when the container has terminated: on a
    live stream that text is read again after the reconnect)."""

    def __init__(self, cursor: LogCursor | None) -> None:
        self.cursor = cursor
        self._buf = b""
        self._counts: dict[int, int] = {}
        self._caught_up = cursor is None
        self._last_ts: tuple[str, int] | None = (cursor.ts, cursor.ts_ns) if cursor else None
        self.skipped = 0

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The new lines completed by ``data``."""
        self._buf += data
        out: list[tuple[str, str]] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            raw, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            line = self._line(raw)
            if line is not None:
                out.append(line)
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The trailing line without a newline, if any (call at the end of a
        read of a terminated container)."""
        raw, self._buf = self._buf, b""
        if not raw:
            return []
        line = self._line(raw)
        return [line] if line is not None else []

    def _line(self, raw: bytes) -> tuple[str, str] | None:
        text = raw.decode("utf-8", "replace")
        text = text.removesuffix("\r")
        ts, _, rest = text.partition(" ")
        try:
            ts_ns = parse_timestamp(ts)
        except ValueError:
            # No timestamp (should not happen with timestamps=true): keep the
            # text, placed after the newest line seen.
            log.warning("log line without a timestamp", text=text[:80])
            ts, ts_ns, rest = (self._last_ts or ("1970-01-01T00:00:00Z", 0)) + (text,)
        n = self._counts.get(ts_ns, 0)
        self._counts[ts_ns] = n + 1
        if len(self._counts) > 4096:
            # Keep the counts of recent timestamps only (lines step back in
            # time by at most a few ms, when stdout and stderr interleave).
            for old in sorted(self._counts)[:2048]:
                del self._counts[old]
        cur = self.cursor
        if not self._caught_up and cur is not None and (ts_ns < cur.ts_ns or (ts_ns == cur.ts_ns and n <= cur.n)):
            self.skipped += 1
            return None
        self._caught_up = True
        if self._last_ts is None or ts_ns >= self._last_ts[1]:
            self._last_ts = (ts, ts_ns)
        return f"{ts}#{n}", rest

    def position(self) -> LogCursor | None:
        """The cursor after the lines returned so far (the newest timestamp)."""
        if self._last_ts is None:
            return self.cursor
        ts, ts_ns = self._last_ts
        return LogCursor(ts, ts_ns, self._counts.get(ts_ns, 1) - 1)


def _after(pos: LogCursor | None, cursor: LogCursor) -> bool:
    """Whether the line at ``pos`` comes after ``cursor`` (timestamp, then count)."""
    return pos is not None and (pos.ts_ns, pos.n) > (cursor.ts_ns, cursor.n)


def split_long_line(pos: str, text: str) -> list[tuple[str, str]]:
    """``(pos, text)`` as is, or — when the text is longer than
    ``MAX_LINE_BYTES`` in UTF-8 — its pieces (:func:`store.split_text`, the
    cut local logs use) at positions ``pos``, ``pos/1``, ``pos/2``..."""
    return [(pos if i == 0 else f"{pos}/{i}", piece) for i, piece in enumerate(split_text(text))]


class LogFollower:
    """Follows one container's log into ``reporter.log_lines`` (stream
    ``"stdout"``: the API serves stdout and stderr merged).

    ``state()`` says where the container is (see :data:`ContainerState`);
    ``changed`` returns an event set when that may have changed. Timings in
    seconds: ``stall_s`` (first stall timeout), ``stall_max_s``,
    ``final_read_s`` (bound of the last read).
    """

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        pod: str,
        container: str,
        reporter: RunReporter,
        state: Callable[[], ContainerState],
        changed: Callable[[], anyio.Event],
        *,
        stall_s: float = 30.0,
        stall_max_s: float = 300.0,
        final_read_s: float = 30.0,
        stats: dict[str, int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.reporter = reporter
        self.state = state
        self.changed = changed
        self.stall_s = stall_s
        self.stall_max_s = stall_max_s
        self.final_read_s = final_read_s
        self.stats = stats if stats is not None else {}
        self.source = f"{pod}/{container}"
        self.cursor: LogCursor | None = None
        self.connects = 0
        self.recorded = 0
        #: The lines past the cursor the last stall check read (see _record_checked).
        self._checked: list[tuple[str, str]] = []
        self.done = anyio.Event()

    @property
    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/log"

    def _query(self, follow: bool) -> list[tuple[str, Any]]:
        q: list[tuple[str, Any]] = [("container", self.container), ("timestamps", "true")]
        if follow:
            q.append(("follow", "true"))
        if self.cursor is not None:
            q.append(("sinceTime", self.cursor.since_time()))
        return q

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    async def _emit(self, lines: Sequence[tuple[str, str]]) -> None:
        pieces = [piece for line in lines for piece in split_long_line(*line)]
        # One reporter call: all of it lands in one transaction, so a line's
        # pieces are recorded together or not at all.
        await self.reporter.log_lines("stdout", self.source, pieces)
        self.recorded += len(lines)

    async def run(self) -> None:
        """Follow until the container has terminated and the final read is
        done (or the pod is gone). Never raises for API trouble: it retries.
        When no read after the last stall check got the lines that check
        saw (the pod went first, or the final read failed), those lines are
        recorded (:meth:`_record_checked`)."""
        try:
            await self._follow_to_the_end()
            await self._record_checked()
        finally:
            self.done.set()

    async def _follow_to_the_end(self) -> None:
        """The follow loop of :meth:`run`."""
        self.cursor = LogCursor.parse(await self.reporter.log_position(self.source))
        backoff = 0.25
        while True:
            state = self.state()
            if state == "gone":
                return
            if state == "terminated":
                await self._final_read()
                return
            if state == "waiting":
                token = self.changed()
                if self.state() == "waiting":
                    with anyio.move_on_after(5.0):
                        await token.wait()
                continue
            try:
                got, how = await self._follow(self.stall_s)
            except NotFoundError:
                log.info("pod gone; log follow ends", source=self.source)
                return
            except KubernetesApiError as err:
                if isinstance(err, BadRequestError) or is_transient(err):
                    log.debug("log not readable yet; retrying", source=self.source, error=str(err))
                else:
                    log.warning("log follow failed; retrying", source=self.source, error=str(err))
                await self._pause(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.25
            if how == "stall":
                log.debug("log stream stalled; reconnecting", source=self.source, new=got)
            else:
                # The stream ended: usually the container did; give the
                # pod watch a moment to say so before following again.
                await self._pause(0.2 if got else 0.5)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when the pod changes; not at all when
        the container is no longer running (the final read is next)."""
        token = self.changed()
        if self.state() != "running":
            return
        with anyio.move_on_after(seconds):
            await token.wait()

    async def _follow(self, stall_s: float) -> tuple[int, str]:
        """One follow request. Returns (lines recorded, how it ended:
        "eof", "stall" or "cut").

        When no byte came for ``stall_s`` seconds, a short non-follow read
        from the cursor (on a pooled connection) tells a quiet container from
        a stalled stream: only when the log has lines past the cursor is the
        stream dropped ("stall"); otherwise the same stream is kept and the
        next check waits twice as long (at most ``stall_max_s``)."""
        decoder = LogDecoder(self.cursor)
        got = 0
        how = "eof"
        wait = stall_s
        self.connects += 1
        self._count("log_follows")
        async with self.cluster.stream(
            self._path, self._query(True), what=f"follow the log of {self.source}", pool_key=self.source
        ) as response:
            # A reader task feeds a queue, so that a wait that times out never
            # cancels the body iterator (a cancelled async generator is done).
            send, receive = anyio.create_memory_object_stream[bytes | Exception | None](64)

            async def pump() -> None:
                async with send:
                    try:
                        async for piece in response.aiter_raw():
                            await send.send(piece)
                    except Exception as exc:  # noqa: BLE001 - the connection dropped mid-body: hand it over
                        await send.send(exc)
                        return
                    await send.send(None)

            async with anyio.create_task_group() as tg, receive:
                tg.start_soon(pump)
                while True:
                    item: bytes | Exception | None = b""
                    with anyio.move_on_after(wait) as scope:
                        item = await receive.receive()
                    if scope.cancelled_caught:
                        self._count("log_stall_checks")
                        newer = await self._newer() if self.state() == "running" else None
                        if newer is not None and not newer[0]:
                            wait = min(wait * 2, self.stall_max_s)
                            continue
                        if newer is not None:
                            # Kept until the next read: if the pod is gone
                            # (its log with it) before that read, these lines
                            # are all that is left of what it printed.
                            self._checked = newer[0]
                        how = "stall"
                        self._count("log_stalls")
                        break
                    if item is None:
                        break
                    if isinstance(item, Exception):
                        log.info("log stream cut; resuming", source=self.source, error=f"{type(item).__name__}: {item}")
                        how = "cut"
                        self._count("log_cuts")
                        break
                    wait = stall_s
                    lines = decoder.feed(item)
                    if lines:
                        await self._emit(lines)
                        got += len(lines)
                        self.cursor = decoder.position()
                tg.cancel_scope.cancel()
        log.debug("log follow ended", source=self.source, how=how, new=got)
        return got, how

    async def _newer(self) -> tuple[list[tuple[str, str]], LogCursor | None] | None:
        """The complete lines past the cursor and the cursor after them,
        from a bounded, non-follow read of at most 64 KiB (no lines: a
        quiet container); None when that cannot be told."""
        decoder = LogDecoder(self.cursor)
        query = [*self._query(False), ("limitBytes", 65536)]
        try:
            with anyio.fail_after(max(5.0, min(15.0, self.stall_s))):
                body: bytes = await self.cluster.request(
                    "GET", self._path, query=query, what=f"check the log of {self.source}", retry=False, raw=True
                )
        except (KubernetesApiError, TimeoutError):
            return None
        return decoder.feed(body), decoder.position()

    async def _record_checked(self) -> None:
        """Record the lines the last stall check read that no later read
        recorded (those past the cursor), in order: the follow ended
        without a complete final read (the pod was gone, or the final read
        failed), and they may be all that is left of what it printed."""
        lines, self._checked = self._checked, []
        cur = self.cursor
        if cur is not None:
            lines = [(pos, text) for pos, text in lines if _after(LogCursor.parse(pos), cur)]
        if lines:
            log.info("log follow ended early; recording the lines the last check read", source=self.source,
                     lines=len(lines))  # fmt: skip
            await self._emit(lines)
            self.cursor = LogCursor.parse(lines[-1][0])

    async def _final_read(self) -> None:
        """Read what is left once the container terminated (not following),
        at most ``final_read_s`` seconds; a trailing line without newline is
        recorded too."""
        for attempt in range(1, 4):
            self._count("log_final_reads")
            decoder = LogDecoder(self.cursor)
            try:
                with anyio.fail_after(self.final_read_s):
                    async with self.cluster.stream(
                        self._path, self._query(False), what=f"read the log of {self.source}", pool_key=self.source
                    ) as response:
                        async for chunk in response.aiter_raw():
                            lines = decoder.feed(chunk)
                            if lines:
                                await self._emit(lines)
                                self.cursor = decoder.position()
                lines = decoder.finish()
                if lines:
                    await self._emit(lines)
                    self.cursor = decoder.position()
                self._checked = []
                return
            except NotFoundError:
                return
            except KubernetesApiError as err:
                log.info("final log read failed", source=self.source, error=str(err), attempt=attempt)
            except TimeoutError:
                log.warning("final log read took too long; stopping", source=self.source, limit_s=self.final_read_s)
                return
            except Exception as exc:  # noqa: BLE001 - the connection dropped mid-body: read again from the cursor
                log.info(
                    "final log read cut", source=self.source, error=f"{type(exc).__name__}: {exc}", attempt=attempt
                )
            await anyio.sleep(0.5 * attempt)
