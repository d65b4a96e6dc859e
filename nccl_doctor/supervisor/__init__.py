"""The supervisor: runs the user's launch command with the recorder injected and watches it."""
