"""Integrations with the libraries jobs use (transformers/TRL trainers) and, later, known-issue
rules. Each module imports its library lazily: importing nccl_doctor never imports them."""
