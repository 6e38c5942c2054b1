"""Method machinery the step's components call: distillation teachers and the
self-teacher's memory, FBOS-RL's guided rounds."""
