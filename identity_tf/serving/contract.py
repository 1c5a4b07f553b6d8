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
# The most pixels (width x height) an image file may declare in its header:
# `predict_images` refuses a larger one before decoding it (a 1 MB PNG can
# declare 20000x20000 pixels, 1.2 GB decoded), and `serving.client` does
# not send it. 8192x8192; a model of a fixed input size takes that size
# alone.
MAX_IMAGE_PIXELS = 1 << 26
# A GIF is decoded whole, every frame of it, even though only the first is
# used: `predict_images` reads a GIF's frame headers first (at most this
# many images and extensions: 2048 frames, each with its graphic control
# extension) and refuses one whose frames are larger than the model takes
# or hold more than MAX_IMAGE_PIXELS pixels in all.
MAX_GIF_BLOCKS = 1 << 12
