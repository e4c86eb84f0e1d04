"""CrewAI-style role and task definitions, loaded as data."""
