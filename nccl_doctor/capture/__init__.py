"""The capture format: one memory-mapped file per rank, written by the recorder, read by the doctor."""
