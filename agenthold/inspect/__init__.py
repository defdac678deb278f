"""The read-only inspector: ``agenthold agents|claims|namespaces|keys|history|log|threads|messages``
and ``agenthold status``, with the terminal text they share (tables.py)."""
