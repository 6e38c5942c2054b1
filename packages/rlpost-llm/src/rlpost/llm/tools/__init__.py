"""What the commands around training use: evaluation and export, the run's curves and
summary, the exploration-hacking monitor, PAT's tensor-parallel simulator and the preset
table."""
