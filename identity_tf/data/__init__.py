"""Data: what a dataset is (`datasets`, no TensorFlow), reading and preparing
TFDS datasets (`tfds_data`), the built-in `synthetic` set, the preprocessing
ops (`preprocessing`) and the tf.data input pipelines (`pipeline`)."""
