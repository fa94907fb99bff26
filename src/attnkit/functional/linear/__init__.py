"""Linear attention, one module per mechanism, each with its readable token-by-token recurrence beside its
exact chunked form:

- :mod:`.feature_maps`: the Linear Transformer and Performer (kernel feature maps and prefix sums);
- :mod:`.delta`: the delta rule and its gates (DeltaNet, Gated DeltaNet, Kimi Delta Attention), gated linear
  attention and lightning attention, and the implicit L x L attention matrix of each;
- :mod:`.ssd`: Mamba-2's state-space layer as gated linear attention (state-space duality).
"""

from .delta import (
    LinearAttentionOutput,
    delta_rule,
    gated_delta_rule,
    gated_linear_attention,
    implicit_attention,
    l2norm,
)
from .feature_maps import causal_linear_step, elu_feature_map, favor_features, linear_attention, orthogonal_projection
from .ssd import ssd, ssd_decays

__all__ = ["elu_feature_map", "favor_features", "orthogonal_projection", "linear_attention", "causal_linear_step",
           "LinearAttentionOutput", "gated_delta_rule", "delta_rule", "gated_linear_attention", "implicit_attention",
           "l2norm", "ssd", "ssd_decays"]
