"""Run I/O shared by every domain: atomic safetensors checkpoints and the metrics log.

These two modules are the only part of ``rlpost.core`` that touches anything besides
torch and numpy: ``safetensors`` (a small, dependency-free package) for pickle-free
checkpoints, and TensorBoard when it is installed. See docs/architecture.md.
"""
