"""identity_tf: Hardt & Ma, "Identity Matters in Deep Learning" (ICLR 2017).

    import identity_tf
    model = identity_tf.build_model("cifar10")

Layers live in `identity_tf.layers`, the networks in `identity_tf.model`.
"""

from identity_tf.layers import ConvResidualUnit
from identity_tf.layers import DenseResidualUnit
from identity_tf.layers import PreActivationUnit
from identity_tf.layers import RandomProjection
from identity_tf.layers import ResidualInitializer
from identity_tf.model import build_model
from identity_tf.model import describe
from identity_tf.model import MODELS
