"""Post-training algorithms for robot policies (OTQL; PAC-ACT and CRAFT to come)."""
