"""A zdmq node: node state, storage, the node service and its HTTP app.

Imports nothing from `zdmq.client`; the client imports nothing from here.
"""
