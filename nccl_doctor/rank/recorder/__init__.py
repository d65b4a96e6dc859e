"""The in-rank recorder: patches torch.distributed and writes the rank's capture file."""
