"""The paper's theory, runnable: Section 2's linear residual networks
(`linear`, with Theorem 2.1's factorization `linear.factorize`; Theorem
2.2's landscape as an experiment, `landscape`; what //bin:linear_theory
does, `linear_run`), the probe of Section 5's conjecture for the
non-linear unit (`conjecture`, //bin:conjecture) and Section 3's construction of a
network that fits n labelled points (`construction`; as a Keras model,
`construction_model`; trained by SGD instead, `construction_sgd`; what
//bin:construct does, `construction_run`; the parameter count against n,
`capacity`; its work split over every core, `parallel`)."""
