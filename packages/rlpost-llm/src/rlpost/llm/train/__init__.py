"""What a trainer step is made of: the step's inputs and their providers, step hooks
around the update, the micro-batched update itself, the optimiser, the critic and the
data-parallel learner. :mod:`rlpost.llm.trainer` is the loop that runs them."""
