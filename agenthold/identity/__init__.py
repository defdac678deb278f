"""Who is calling and what an agent is: principals with their tokens and scopes (principals.py,
standard library only, so ``agenthold token ...`` never imports mcp), and the agent registry
that claims and the bus share (agents.py)."""
