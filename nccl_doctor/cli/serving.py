"""``run --serve [HOST:]PORT``: the options, and the endpoint's life around the supervised run
(nccl_doctor/serve/: what it serves and how)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Callable, TextIO

if TYPE_CHECKING:  # the endpoint (http.server, prometheus_client) is imported for --serve only
    from nccl_doctor.serve.publisher import Publisher
    from nccl_doctor.serve.server import Endpoint
    from nccl_doctor.supervisor.supervisor import Supervisor

DEFAULT_LINGER = 30.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live endpoint", "docs/serve.md")
    g.add_argument("--serve", type=_address, default=None, metavar="[HOST:]PORT",
                   help="serve the job live over HTTP while it runs: /metrics (Prometheus), "
                        "/report.json, /status.json and / (a page that reloads itself). HOST "
                        "defaults to 127.0.0.1 ([::1] for IPv6); another address only when "
                        "given (no authentication: bind a network address only on a trusted "
                        "network). PORT 0 picks a free port")
    g.add_argument("--serve-linger", type=_linger, default=DEFAULT_LINGER, metavar="SECONDS",
                   help="after a job whose verdict is not ok, keep serving its final report "
                        f"this long, for a scrape to see it (default {DEFAULT_LINGER:.0f}; 0: "
                        "end at once; Ctrl-C ends it), or until it has been read (fetched, "
                        "and scraped if Prometheus was scraping)")


def _address(text: str) -> tuple[str, int]:
    from nccl_doctor.serve.server import parse_address

    try:
        return parse_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _linger(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds")
    return value


class Serving:
    """The endpoint of one run: ``listen`` before anything else is done (an address that
    cannot be had is the user's error, and nothing was touched), ``watch`` the supervisor,
    ``linger`` once everything is reported, ``close`` always."""

    def __init__(self, publisher: Publisher, endpoint: Endpoint, linger_s: float,
                 err: TextIO) -> None:
        self.publisher, self.endpoint, self.linger_s, self.err = publisher, endpoint, linger_s, err
        self._supervisor: Supervisor | None = None

    @classmethod
    def listen(cls, args: argparse.Namespace, err: TextIO) -> Serving | None:
        if args.serve is None:
            return None
        from nccl_doctor.serve.publisher import Publisher
        from nccl_doctor.serve.server import Endpoint

        host, port = args.serve
        publisher = Publisher()
        endpoint = Endpoint(host, port, lambda: publisher.current)
        err.write(f"nccl-doctor: serving {endpoint.url} (/metrics, /report.json, "
                  "/status.json)\n")
        if host not in _LOOPBACK:
            err.write(f"nccl-doctor: {endpoint.url} is reachable from the network, with no "
                      "authentication; every page is read-only\n")
        err.flush()
        return cls(publisher, endpoint, args.serve_linger, err)

    def watch(self, supervisor: Supervisor, page: Callable[[], str]) -> None:
        """Publish ``supervisor``'s job each tick (``page``: report.html as last drawn)."""
        self._supervisor = supervisor
        self.publisher.page = page
        supervisor.attach(self.publisher)

    def linger(self, wait: bool = True) -> None:
        """The final report published; served ``linger_s`` more when its verdict is not ok
        (and ``wait``: not after the user's Ctrl-C - the user is at the terminal), or
        until it has been read (the endpoint's ``final_read``: the report fetched and, if
        Prometheus was scraping, its scrape of the final look). A failure here costs the
        endpoint's last look, never the run's result."""
        if self._supervisor is None:
            return
        try:
            self.publisher(self._supervisor)
        except Exception as err:  # noqa: BLE001 - the run is over and reported
            self.err.write(f"nccl-doctor: the endpoint's final look failed ({err!r})\n")
            return
        if self.publisher.current.verdict in ("ok", "none") or self.linger_s <= 0 or not wait:
            return
        self.err.write(f"nccl-doctor: serving the final report at {self.endpoint.url} for "
                       f"{self.linger_s:.0f} s more, or until it is read (Ctrl-C ends it)\n")
        self.err.flush()
        try:
            read = self.endpoint.final_read.wait(self.linger_s)
        except KeyboardInterrupt:
            return
        if read:
            self.err.write(f"nccl-doctor: the final report was read at {self.endpoint.url}\n")
            self.err.flush()

    def close(self) -> None:
        self.endpoint.close()
