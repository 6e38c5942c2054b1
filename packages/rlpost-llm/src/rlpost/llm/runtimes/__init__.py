"""Runtimes: how a run is driven, one registered entry each (the GRPO-family trainer,
the preference and DLR trainers, and the multi-policy runtimes CoPD, Mutual RL and
federated training on Ray)."""
