"""Fleets (LWD, catalog 001-23; the learner is any algorithm with a fleet learner): many
robots, one learner, nothing lost."""
