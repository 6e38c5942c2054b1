"""The ``rlpost-diffusion`` command-line app: argument parsing and wiring only."""
