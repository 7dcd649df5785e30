"""The async Python client. Imports nothing from `zdmq.server`."""

from zdmq.client.client import CallStats, Client
from zdmq.client.consumer import Consumer, Outcome

__all__ = ["CallStats", "Client", "Consumer", "Outcome"]
