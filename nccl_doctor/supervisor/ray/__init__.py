"""A Ray cluster's nodes under one diagnosis (``nccl-doctor run --ray``): a node doctor on every
other node of the cluster, scheduled there by Ray itself, each a follower of this supervisor."""
