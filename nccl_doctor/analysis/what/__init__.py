"""What happened: the detectors. Desyncs (missing and mismatched collectives), ranks that
exited, a node lost, group creation and the rendezvous, point-to-point channels, a GPU hang,
a live hang's findings, the first error of a crash.

Imports ``calls``, ``why`` and ``who``."""
