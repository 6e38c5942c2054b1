"""The ``rlpost-llm`` command-line app: argument parsing and wiring only."""
