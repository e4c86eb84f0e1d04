"""Deterministic capabilities the agents call: hardware, models, memory, configs, smoke runs."""
