"""The HTTP endpoint of ``run --serve`` (a thread of the supervisor's process).

Every answer is drawn from the ``Published`` look the supervisor swapped in last, at most once
per look (``_Drawn``), so a request never waits on the watchdog and a flood of them costs the
supervisor's loop only the GIL slices of copying bytes out. Bounded: at most ``CONCURRENT``
connections at once (one more is answered 503 by the accepting thread and closed), a socket
timeout, GET and HEAD only, nothing written to the job's terminal.

It also tells the run when its final look has been read (``final_read``): the final report
(``/``, ``/report.json`` or ``/report.html``) served from it and, when Prometheus has been
scraping, ``/metrics`` too - the linger then ends (cli/serving.py).
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from nccl_doctor.errors import UsageError
from nccl_doctor.serve import live_page, metrics
from nccl_doctor.serve.state import Published

#: Connections served at once; more get 503 (a scraper or a browser needs one or two).
CONCURRENT = 8
TIMEOUT_S = 5.0

#: The paths that show the report to a reader: one served from the final look ends the linger.
REPORTS = ("/", "/report.json", "/report.html")

_TYPES = {
    "/metrics": "text/plain; version=0.0.4; charset=utf-8",
    "/report.json": "application/json",
    "/status.json": "application/json",
    "/report.html": "text/html; charset=utf-8",
    "/": "text/html; charset=utf-8",
}


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` -> (host, port); the host defaults to loopback, an IPv6 one is written
    in brackets (``[::1]:9400``). ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9400")
    host = host or "127.0.0.1"
    number = int(port) if port.isdigit() else -1
    if not 0 <= number <= 65535:
        raise ValueError(f"{text!r}: give [HOST:]PORT, e.g. 9400 or 0.0.0.0:9400")
    return host, number


class _Drawn:
    """The answers of one look, each drawn on first request."""

    def __init__(self, pub: Published) -> None:
        self.pub = pub
        self._lock = threading.Lock()
        self._bodies: dict[str, bytes | None] = {}

    def body(self, path: str) -> bytes | None:
        with self._lock:  # (a look's requests draw it once; the supervisor never takes this)
            if path not in self._bodies:
                self._bodies[path] = self._draw(path)
            return self._bodies[path]

    def _draw(self, path: str) -> bytes | None:
        pub = self.pub
        if path == "/metrics":
            return metrics.render(pub)
        if path == "/report.json":
            return pub.report_json.encode() if pub.report_json else None
        if path == "/status.json":
            return pub.status_json().encode()
        if path == "/report.html":
            return pub.report_html.encode() if pub.report_html else None
        return live_page.render(pub).encode()


class Endpoint:
    """Serves ``current()`` (the publisher's newest look) at ``host:port`` until ``close``."""

    def __init__(self, host: str, port: int, current: Callable[[], Published]) -> None:
        self.current = current
        self._drawn: _Drawn | None = None
        #: Set once the final look has been read: its report served (a REPORTS path) and, if
        #: /metrics was ever served, /metrics too (a scraper's look at the final state).
        self.final_read = threading.Event()
        self._reads = threading.Lock()
        self._scraped = self._final_scraped = self._final_report = False
        handler = _handler(self)
        kind = _Server6 if ":" in host else _Server
        try:
            self.server = kind((host, port), handler)
        except OSError as err:
            shown = f"[{host}]" if ":" in host else host
            raise UsageError(f"--serve {shown}:{port}: cannot listen there "
                             f"({err.strerror or err}); choose another port") from None
        self.host, self.port = self.server.server_address[:2]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.5,),
                                        name="nccl-doctor-serve", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}/"

    def drawn(self) -> _Drawn:
        pub = self.current()
        held = self._drawn
        if held is None or held.pub is not pub:
            held = self._drawn = _Drawn(pub)
        return held

    def asked(self, path: str) -> None:
        """A GET of ``path`` is being answered: a scraper that asks for /metrics is one from
        then on (a report read while its first scrape is still being written waits for the
        scrape of the final look)."""
        if path == "/metrics":
            with self._reads:
                self._scraped = True

    def served(self, path: str, pub: Published) -> None:
        """``path``'s answer from ``pub`` was written in full (a GET that found it)."""
        with self._reads:
            if path == "/metrics":
                self._final_scraped = self._final_scraped or pub.final
            elif path in REPORTS and pub.final:
                self._final_report = True
            if self._final_report and (self._final_scraped or not self._scraped):
                self.final_read.set()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class _Server(ThreadingHTTPServer):
    """At most ``CONCURRENT`` connections at once: one more is answered 503 and closed by the
    accepting thread itself, no thread made for it; errors (a client gone mid-answer) are
    nobody's business but the client's: nothing is printed."""

    daemon_threads = True
    request_queue_size = 32

    def __init__(self, *args: object) -> None:
        self.slots = threading.BoundedSemaphore(CONCURRENT)
        super().__init__(*args)  # type: ignore[arg-type]

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        pass  # the job's terminal is the job's


class _Server6(_Server):
    address_family = socket.AF_INET6


_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 32\r\nConnection: close\r\n\r\nbusy: too many requests at once\n")


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = TIMEOUT_S
        server_version = "nccl-doctor"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(head=False)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(head=True)

        def _answer(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/index.html":
                path = "/"
            if path not in _TYPES:
                self._send(404, b"not found: / /metrics /report.json /status.json "
                                b"/report.html\n", "text/plain", head)
                return
            if not head:
                endpoint.asked(path)
            drawn = endpoint.drawn()
            body = drawn.body(path)
            if body is None:
                self._send(404, b"no report yet: the job is being watched\n", "text/plain",
                           head)
                return
            self._send(200, body, _TYPES[path], head)
            if not head:  # (written: the process may end once the final look is read)
                endpoint.served(path, drawn.pub)

        def _send(self, code: int, body: bytes, kind: str, head: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy",
                             "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # the job's terminal is the job's

    return Handler
