"""The kernel-agent HTTP services: evaluator, implementer and trainer."""
