"""The async Python client. Imports nothing from `zdmq.server`."""

from zdmq.client.client import CallStats, Client

__all__ = ["CallStats", "Client"]
