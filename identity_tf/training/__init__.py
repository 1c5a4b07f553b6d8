"""Training the paper's networks: the loop, its run directory, evaluation,
the optimisation, strategies, studies of many runs and the loss's
sharpness."""
