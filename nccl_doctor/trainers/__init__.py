"""Small, readable reference trainers (DPO, CPO, SimPO, ORPO, GRPO) that run on CPU with gloo.

They use a tiny causal LM built from a config (random weights, no download) and an offline
word-level tokenizer (``tiny``), the papers' losses (``losses``), per-rank padding and the metric
gathering real trainers do. The reproducers (nccl_doctor.reproducers) switch one detail to
reproduce each upstream bug of docs/bugs.md.
"""
