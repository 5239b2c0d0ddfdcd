"""Replay backends: engines that run a workload against a memory implementation.

``replay.backends.sglang.env`` makes the real sglang 0.5.23 importable on a CPU-only machine;
``replay.backends.sglang`` drives its genuine pools, radix cache and admission code.
"""
