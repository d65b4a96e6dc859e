"""Who is to blame and who is who: the rank a divergence starts on (its branch, its line), each
rank's role (mesh coordinates, pipeline stage), the Ray actor a rank is.

Imports ``calls`` and ``why``."""
