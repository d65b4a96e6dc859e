"""``run --serve [HOST:]PORT``: the options, and the endpoint's life around the supervised run
(nccl_doctor/serve/: what it serves and how)."""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

DEFAULT_LINGER = 30.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live endpoint", "docs/serve.md")
    g.add_argument("--serve", default=None, metavar="[HOST:]PORT",
                   help="serve the job live over HTTP while it runs: /metrics (Prometheus), "
                        "/report.json, /status.json and / (a page that reloads itself). HOST "
                        "defaults to 127.0.0.1; another address only when given (no "
                        "authentication: bind a network address only on a trusted network). "
                        "PORT 0 picks a free port")
    g.add_argument("--serve-linger", type=_linger, default=DEFAULT_LINGER, metavar="SECONDS",
                   help="after a job whose verdict is not ok, keep serving its final report "
                        f"this long, for a scrape to see it (default {DEFAULT_LINGER:.0f}; 0: "
                        "end at once; Ctrl-C ends it)")


def _linger(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds")
    return value


@contextmanager
def serving(args: argparse.Namespace, supervisor: object, page: Callable[[], str],
            err: TextIO) -> Iterator[None]:
    """Serve ``supervisor``'s job for the block (nothing without --serve). The endpoint listens
    before the job starts: an address that cannot be had is the user's error, and no job ran."""
    if args.serve is None:
        yield
        return
    from nccl_doctor.serve.publisher import Publisher
    from nccl_doctor.serve.server import Endpoint, parse_address

    host, port = parse_address(args.serve)
    publisher = Publisher(page)
    endpoint = Endpoint(host, port, lambda: publisher.current)
    supervisor.attach(publisher)  # type: ignore[attr-defined]
    err.write(f"nccl-doctor: serving {endpoint.url} (/metrics, /report.json, /status.json)\n")
    if host not in _LOOPBACK:
        err.write(f"nccl-doctor: {host}:{endpoint.port} is reachable from the network, with no "
                  "authentication; every page is read-only\n")
    err.flush()
    try:
        yield
        publisher(supervisor)  # the final report
        if publisher.current.verdict not in ("ok", "none") and args.serve_linger > 0:
            err.write(f"nccl-doctor: serving the final report at {endpoint.url} for "
                      f"{args.serve_linger:.0f} s more (Ctrl-C ends it)\n")
            err.flush()
            try:
                time.sleep(args.serve_linger)
            except KeyboardInterrupt:
                pass
    finally:
        endpoint.close()

