"""FLOP-counting rules of the mmevo ops for mmengine's ``FlopAnalyzer``.

mmengine's jit-based counter (one multiply-add = one FLOP) has no handle for
custom operators: without these the work in the evolution ops is silently
left out of a model's count. (A traced model runs its stock graph, see
:mod:`mmevo.layers.fastpath`, so every other op is one mmengine counts.)

Example:
    >>> from mmengine.analysis import FlopAnalyzer
    >>> analyzer = FlopAnalyzer(model, (inputs, ))
    >>> analyzer.set_op_handle(**FLOP_HANDLES)
    >>> analyzer.by_operator()['evolution_aggregate']
"""

#: Operator names (as ``FlopAnalyzer.by_operator`` reports them) of the
#: mmevo ops.
MMEVO_OPS = (
    'evolution_aggregate',
    'local_correlation',
    'local_attention_weights',
)


def _shape(value):
    shape = value.type().sizes() if value.isCompleteTensor() else None
    if shape is None:
        raise ValueError(
            f'cannot count FLOPs of an op on {value.type()}: '
            'its input shape is unknown to the tracer'
        )
    return shape


def evolution_aggregate_flop(inputs, outputs):
    """FLOPs of ``mmevo::evolution_aggregate``: B*C*H_out*W_out*K*K
    multiply-adds (each output element sums K*K weighted inputs).

    Args:
        inputs (list[torch._C.Value]): the op's traced inputs; inputs[1] is
            the kernel (B, G, K, K, H_out, W_out).
        outputs (list[torch._C.Value]): the output (B, C, H_out, W_out).

    Returns:
        int: the multiply-add count.
    """
    b, c, h_out, w_out = _shape(outputs[0])
    k_h, k_w = _shape(inputs[1])[2:4]
    return b * c * h_out * w_out * k_h * k_w


def local_correlation_flop(inputs, outputs):
    """FLOPs of ``mmevo::local_correlation``: B*C*H_out*W_out*K*K
    multiply-adds (each of the G*K*K correlations per position sums C/G
    channel products).

    Args:
        inputs (list[torch._C.Value]): inputs[0] is the query
            (B, C, H_out, W_out).
        outputs (list[torch._C.Value]): the output (B, G, K, K, H_out, W_out).

    Returns:
        int: the multiply-add count.
    """
    b, c, h_out, w_out = _shape(inputs[0])
    k_h, k_w = _shape(outputs[0])[2:4]
    return b * c * h_out * w_out * k_h * k_w


#: Handles of the mmevo operators, by traced operator name
#: (``set_op_handle(**FLOP_HANDLES)``).
FLOP_HANDLES = {
    'mmevo::evolution_aggregate': evolution_aggregate_flop,
    'mmevo::local_correlation': local_correlation_flop,
    # The correlation's multiply-adds; its softmax is not counted (as
    # fvcore / mmengine count no softmax).
    'mmevo::local_attention_weights': local_correlation_flop,
}
