"""The interface every reporter has: render a Diagnosis to a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from nccl_doctor.diagnosis import Diagnosis


class Reporter(Protocol):
    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        """Write ``diagnosis`` to ``stream``."""
