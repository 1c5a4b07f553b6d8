"""The normalisation-free methods that came after the paper, as their
authors built them: `fixup` (Zhang, Dauphin & Ma, 2019), `skipinit` (De &
Smith, 2020) and `nf_resnet` (Brock, De & Smith, 2021). Each module holds a
method's residual unit and `build`, its network at Table 1's widths and
depths (`identity_tf.model.build_model` calls it for the model of the same
name); their training recipes are presets in `identity_tf.configs`.
"""
