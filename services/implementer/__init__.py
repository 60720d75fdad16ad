"""The implementer service: turns a kernel plus one optimization suggestion into a new candidate kernel."""
