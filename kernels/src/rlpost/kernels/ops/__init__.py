"""Ops: each in ``ops/<op>/`` with a readable torch reference and a Triton kernel."""
