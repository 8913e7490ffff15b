"""Gradient-sharing codec: Strom 2015 threshold encoding with residuals.

Split as in GRACE: `codec` (compressor: encode/decode), `residual` (memory post-processing),
`threshold` (policies), `wire` (bytes), `encoder` (one step per minibatch), `stats`,
`fastpath` (the one-pass CPU encode of ``torchspark[fast]``); `compressor` is the codec slot of gradient
sharing (the protocol, the threshold codec behind it, the registry) and `topk` its second codec.
"""

from __future__ import annotations

from torchspark.encoding.calibration import agree_threshold, calibrated_threshold
from torchspark.encoding.codec import (
    EncodedUpdate,
    accumulate_step,
    decode,
    decode_sum,
    float32_update,
    sparse_decode_sum,
    threshold_encode,
)
from torchspark.encoding.compressor import (
    COMPRESSORS,
    CompressedMessage,
    Compressor,
    ThresholdCompressor,
    compressor_from_dict,
)
from torchspark.encoding.encoder import EncoderConfig, EncoderState, encode_step, local_calibration, with_calibration
from torchspark.encoding.fastpath import FastPathStatus, fast_path_status
from torchspark.encoding.residual import (
    RESIDUAL_POST_PROCESSORS,
    NoResidualPostProcessing,
    ResidualClipping,
    ResidualPostProcessor,
    residual_post_processor_from_dict,
)
from torchspark.encoding.stats import EncodingStats
from torchspark.encoding.threshold import (
    CALIBRATED,
    NUM_SUMMANDS,
    THRESHOLD_POLICIES,
    AdaptiveThreshold,
    FixedThreshold,
    TargetSparsityThreshold,
    ThresholdPolicy,
    ThresholdState,
    average_from_sums,
    average_states,
    shake_up_threshold,
    state_summands,
    threshold_policy_from_dict,
)
from torchspark.encoding.topk import TopKCompressor, TopKMessage
from torchspark.encoding.wire import from_bytes, to_bytes

__all__ = [
    "Compressor",
    "CompressedMessage",
    "ThresholdCompressor",
    "TopKCompressor",
    "TopKMessage",
    "COMPRESSORS",
    "compressor_from_dict",
    "EncodedUpdate",
    "threshold_encode",
    "decode",
    "decode_sum",
    "sparse_decode_sum",
    "accumulate_step",
    "float32_update",
    "to_bytes",
    "from_bytes",
    "FastPathStatus",
    "fast_path_status",
    "EncodingStats",
    "ThresholdState",
    "ThresholdPolicy",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "THRESHOLD_POLICIES",
    "NUM_SUMMANDS",
    "average_from_sums",
    "CALIBRATED",
    "calibrated_threshold",
    "agree_threshold",
    "average_states",
    "shake_up_threshold",
    "state_summands",
    "threshold_policy_from_dict",
    "ResidualPostProcessor",
    "ResidualClipping",
    "NoResidualPostProcessing",
    "RESIDUAL_POST_PROCESSORS",
    "residual_post_processor_from_dict",
    "EncoderConfig",
    "EncoderState",
    "encode_step",
    "local_calibration",
    "with_calibration",
]
