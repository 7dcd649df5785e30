"""Benchmarks: one harness, one `Driver` interface, zdmq and its peers side by side.

`zdmq bench` runs it (zdmq.bench.runner); the peers' drivers live in loadtest/peers/.
"""
