"""How a step's rollouts are made: the engines that sample, multi-turn agents and their
chat rendering, the reward functions that score, and the rollout sources that decide when
generation runs relative to the update."""
