"""Wire contracts and HTTP clients shared by the evaluator, implementer and trainer services."""
