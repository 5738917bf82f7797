"""Baseline methods the paper compares against, run on the same shards (docs/algorithms.md)."""
