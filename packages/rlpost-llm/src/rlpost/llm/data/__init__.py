"""What the policy trains on: prompt streams (tasks, files, mixtures, curricula), the
built-in verifiable tasks and text environments, auxiliary data sets and the code
sandbox that verifies generated programs."""
