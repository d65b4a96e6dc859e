"""A Slurm allocation's nodes under one diagnosis (``nccl-doctor run -- srun ...`` inside
``salloc`` or an ``sbatch`` script): a node doctor on every other node of the allocation,
started by Slurm itself as an overlapping step, each a follower of this supervisor."""
