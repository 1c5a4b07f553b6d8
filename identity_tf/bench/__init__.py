"""Measuring: the tools (`tools`: FLOP counts, peaks, timing, the PyTorch
twin) and the suites of //bin:benchmark (`suites`)."""
