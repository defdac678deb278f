"""Who is calling and who they are: principals with their tokens and scopes (principals.py,
standard library only, so ``agenthold token ...`` never imports mcp)."""
