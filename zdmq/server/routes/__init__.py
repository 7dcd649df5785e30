"""The node's HTTP routes, by what they serve: queues, topics, the node-to-node protocol and
the operator's calls. app.py puts them behind their credential checks."""
