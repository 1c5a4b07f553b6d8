"""The paper's theory, runnable: Section 2's linear residual networks
(`linear`, with Theorem 2.1's factorization `linear.factorize`; what
//bin:linear_theory does, `linear_run`) and Section 3's construction of a
network that fits n labelled points (`construction`; as a Keras model,
`construction_model`; trained by SGD instead, `construction_sgd`; what
//bin:construct does, `construction_run`; its work split over every core,
`parallel`)."""
