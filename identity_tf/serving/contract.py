"""The contract between an exported model and its clients: the names.

`export` writes SavedModels with these signatures, input and outputs;
`serving_client` sends requests that use them. Both import them from here,
so neither depends on the other.
"""

# `serving_default`: float32 raw 0-255 pixels [batch, H, W, C].
DEFAULT_SIGNATURE = "serving_default"
# `predict_images`: encoded JPEG or PNG files, string [batch].
IMAGES_SIGNATURE = "predict_images"
SIGNATURES = (DEFAULT_SIGNATURE, IMAGES_SIGNATURE)
# The one input of both signatures.
INPUT_KEY = "images"
# The outputs: softmax probabilities float32 [batch, classes] and the most
# probable class int64 [batch].
PROBABILITIES_KEY = "probabilities"
CLASSES_KEY = "classes"
# What an export writes beside the SavedModel: classes, input, preprocessing.
MODEL_INFO_FILE = "model_info.json"
