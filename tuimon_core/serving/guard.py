"""Serving an aiohttp application so that slow or hostile clients cannot starve it.

aiohttp's own `run_app` has no limit on connections that never finish their request: a
thousand sockets that send a byte now and then hold a thousand descriptors, and once
the process is out of descriptors `accept()` fails on every loop turn, `/healthz` and
`/metrics` stop answering, and asyncio logs a traceback per failure. So the agent and
the relay serve through `GuardedSite`:

- the listening socket is bound first (a port in use is a clear error before the agent
  opens NVML or its step socket);
- every connection is pending until a request passes the token check (the middleware
  admits it); pending connections are capped (`max_pending`, below the descriptor
  limit), the oldest is closed to make room, and each must be admitted within
  `header_timeout` seconds;
- `accept()` failures (EMFILE) are logged once a minute with a count, not as a
  traceback each;
- the soft descriptor limit is raised to the hard one at start.

`serve()` is `run_app`'s part for the commands: bind, set up (the application's
cleanup_ctx starts the agent), serve until SIGINT or SIGTERM, clean up.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tuimon_core.serving.security import ConfigError, ListenAddress

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
KEEPALIVE_S = 15.0
GUARD = web.AppKey("connection_guard", object)


def descriptor_limit(raise_soft: bool = False) -> int:
    """The soft limit on open descriptors (raised to the hard limit when asked)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_soft and soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class ConnectionGuard:
    """Pending (not yet admitted) connections: at most `max_pending`, each for at most
    `header_timeout` seconds."""

    def __init__(self, max_pending: int | None = None,
                 header_timeout: float = HEADER_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # A quarter of the descriptors: room for streams, scrapes and files beside them.
        self.max_pending = max_pending or max(16, min(1024, descriptor_limit() // 4))
        self.header_timeout = header_timeout
        self.clock = clock
        self._pending: OrderedDict[asyncio.BaseTransport, float] = OrderedDict()
        self._sweeper: asyncio.TimerHandle | None = None
        self.evicted = 0
        self.timed_out = 0

    def wrap(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        return _Guarded(inner, self)

    def opened(self, transport: asyncio.BaseTransport) -> None:
        while len(self._pending) >= self.max_pending:
            oldest, _ = self._pending.popitem(last=False)
            self.evicted += 1
            _abort(oldest)
        self._pending[transport] = self.clock() + self.header_timeout
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    def admit(self, transport: asyncio.BaseTransport | None) -> None:
        if transport is not None:
            self._pending.pop(transport, None)

    def closed(self, transport: asyncio.BaseTransport) -> None:
        self._pending.pop(transport, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.clock()
        while self._pending:
            transport, deadline = next(iter(self._pending.items()))
            if deadline > now:
                break
            del self._pending[transport]
            self.timed_out += 1
            _abort(transport)
        if self._pending:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)


def _abort(transport: asyncio.BaseTransport) -> None:
    with contextlib.suppress(Exception):
        transport.abort()  # type: ignore[attr-defined]


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard told when it opens and
    closes."""

    __slots__ = ("guard", "inner", "transport")

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard.opened(transport)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.guard.closed(self.transport)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def guard_of(app: web.Application) -> ConnectionGuard:
    guard = app.get(GUARD)
    if not isinstance(guard, ConnectionGuard):
        guard = ConnectionGuard()
        app[GUARD] = guard
    return guard


class GuardedSite(web.SockSite):
    """A site on a socket bound beforehand, whose connections go through the app's
    ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context, backlog=512)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self.guard.wrap(server()), sock=self._sock, ssl=self._ssl_context,
            backlog=self._backlog)


def bind(listen: ListenAddress) -> socket.socket:
    """The listening socket, bound now: a port in use is a clear error before anything
    else starts."""
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, family, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"cannot listen on {listen}: the address is in use (another "
                              "agent or relay running? give --listen another port)") from None
        raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def runner_for(app: web.Application) -> web.AppRunner:
    # keepalive_timeout also closes a connection that has not finished its first request
    # (aiohttp arms it at connection start); the guard holds the firmer limit.
    return web.AppRunner(app, access_log=None, handle_signals=False,
                         keepalive_timeout=KEEPALIVE_S)


class AcceptErrors:
    """A loop exception handler that turns asyncio's traceback per failed `accept()`
    (out of descriptors) into one line a minute with a count."""

    def __init__(self, previous: Any = None, every: float = 60.0) -> None:
        self.previous = previous
        self.every = every
        self.count = 0
        self._last = -1e18
        self._since = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        exc = context.get("exception")
        if "accept" in message and isinstance(exc, OSError):
            self.count += 1
            self._since += 1
            now = time.monotonic()
            if now - self._last >= self.every:
                log.error("cannot accept connections: %s (%d failures since the last "
                          "message; slow clients are closed after %.0f s)",
                          exc.strerror or exc, self._since, HEADER_TIMEOUT_S)
                self._last, self._since = now, 0
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


async def serve_app(app: web.Application, sock: socket.socket,
                    ssl_context: ssl.SSLContext | None = None,
                    on_ready: Callable[[], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then close streams and stop the application."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptErrors(loop.get_exception_handler()))
    runner = runner_for(app)
    await runner.setup()
    try:
        site = GuardedSite(runner, sock, guard_of(app), ssl_context)
        await site.start()
        if on_ready is not None:
            on_ready()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(app: web.Application, listen: ListenAddress, ssl_context: ssl.SSLContext | None = None,
          on_ready: Callable[[], None] | None = None) -> None:
    """What `web.run_app` does for the commands, with the guard (see the module doc)."""
    descriptor_limit(raise_soft=True)
    sock = bind(listen)
    try:
        asyncio.run(serve_app(app, sock, ssl_context, on_ready))
    finally:
        sock.close()
