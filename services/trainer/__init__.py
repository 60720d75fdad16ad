"""Multi-turn GRPO trainer of the suggestion model; talks to the implementer and evaluator over HTTP only."""
