"""The ``rlpost-robot`` command-line app: argument parsing and wiring only."""
