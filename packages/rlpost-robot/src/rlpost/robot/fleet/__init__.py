"""LWD fleets (catalog 001-23): many robots, one learner, nothing lost."""
