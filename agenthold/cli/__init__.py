"""The ``agenthold`` command line: the parser and dispatch (main.py) and the subcommands that are
not the inspector's (tokens, retention, backup, completion). ``agenthold.cli.main.main`` is the
entry point that ``agenthold/__main__.py`` calls when no warm server takes the call."""
