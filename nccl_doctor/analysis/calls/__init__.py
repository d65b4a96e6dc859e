"""What was recorded, read (no findings): the ranks' calls aligned per group, how each rank
ended, the steps of a job, the point-to-point channels, where each rank stands now, and the
words every pass uses to name a call, a rank and a line.

The lowest of the analysis sub-packages: it imports none of the others."""
