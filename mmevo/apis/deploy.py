"""What ``tools/deployment`` does, as functions: check an export against
PyTorch and evaluate it on a config's test set."""

import os.path as osp

import torch

from mmevo.deploy import (
    check_outputs,
    expected_outputs,
    exportable,
    model_kind,
    runtime_predict,
)
from mmevo.deploy.runtime import InputMismatchError

from .errors import fail, one_line_errors
from .runner import build_runner, check_data, dump_results, load_config


def other_size(shape):
    """An input size of another aspect, odd, for the check of a dynamic
    export: 3/4 of the height, 5/4 of the width, rounded to odd.

    Example:
        >>> other_size([128, 128])
        [97, 161]
    """
    h, w = shape
    return [max(1, h * 3 // 4) | 1, max(1, w * 5 // 4) | 1]


def report_parity(model, runtime, inputs, kind, name, dynamic=False):
    """Print how far ``runtime`` (called ``name`` in messages) is from
    PyTorch on each input; :func:`fail` in one line if too far, or if it
    fails (see :func:`mmevo.deploy.check_outputs`).

    Args:
        model (nn.Module): The exported model.
        runtime (callable): The export.
        inputs (list[Tensor]): The export's example input first, then the
            other sizes a dynamic export must take.
        kind (str): The model's :func:`mmevo.deploy.model_kind`.
        name (str): The runtime in the messages.
        dynamic (bool): The export was asked for dynamic sizes
            (``--dynamic``): a failure at another size says so.
            Default: False.

    Example:
        >>> report_parity(model, OnnxModel('det.onnx'), [x], 'det',
        ...               'onnxruntime')
    """
    for i, x in enumerate(inputs):
        try:
            (err,) = check_outputs(model, runtime, [x], kind)
        except ValueError as e:
            if not (dynamic and i):
                fail(f'{name} {e}')
            detail = str(e)
            if isinstance(e.__cause__, InputMismatchError):
                problems = '; '.join(e.__cause__.problems)
                detail = f'at {tuple(x.shape)}: {problems}'
            fail(
                f'--dynamic: the {name} graph does not take another size '
                f"than the export's: {detail}; the exporter fixed the sizes: "
                'export this model without --dynamic, at the size it runs'
            )
        print(
            f'[export] {tuple(x.shape)}: {name} vs PyTorch max relative '
            f'difference {err:.1e}'
        )


def check_test_input(runner, session, name, path):
    """Before the evaluation loop: ``session`` (the export at ``path``)
    takes the test pipeline's first image and gives outputs of the shapes
    of the config's model, else :func:`fail` in one line (an export at
    another fixed size, of another class count).

    Example:
        >>> check_test_input(runner, AotiModel('m.pt2'), 'AOTInductor',
        ...                  'm.pt2')
    """
    batch = next(iter(runner.test_dataloader))
    x = runner.model.data_preprocessor(batch, False)['inputs'][:1]
    try:
        outputs = session(x)
    except InputMismatchError as e:
        fail(f"the test pipeline's images do not fit: {e}")
    model, kind = exportable(runner.model.eval())
    with torch.no_grad():
        expected = model(x)
    shapes = [tuple(t.shape) for t in outputs]
    theirs = [tuple(t.shape) for t in expected]
    for i, (ours, ref) in enumerate(zip(shapes, theirs, strict=False)):
        # a two-stage detector's graph gives as many rows as detections
        same = ours[1:] == ref[1:] if kind == 'two-stage' else ours == ref
        if not same:
            fail(
                f"{name} model '{path}' gives output {i} of shape {ours} "
                f"on the test pipeline's first image, the config's model "
                f'{ref}: it was exported from another model (another '
                "class count?); export this config's checkpoint"
            )
    if len(shapes) != len(theirs):
        fail(
            f"{name} model '{path}' gives {len(shapes)} outputs, the "
            f"config's model {len(theirs)}: export this config's checkpoint"
        )


def evaluate_exported(args, runtime, name):
    """``tools/test.py``'s run of ``args.config`` with the predictions of
    ``runtime(args.model)``, post-processed by the config's own heads.

    Args:
        args (argparse.Namespace): ``config``, ``model`` (the export) and
            :func:`mmevo.cli.add_evaluation_args`'s.
        runtime (type): e.g. :class:`mmevo.deploy.OnnxModel`.
        name (str): the runtime in messages and the default work dir.

    Returns:
        dict: the test metrics.

    Example:
        >>> evaluate_exported(args, AotiModel, 'AOTInductor')
    """
    if not osp.isfile(args.model):
        fail(f"{name} model '{args.model}' does not exist")
    with one_line_errors():
        cfg = load_config(
            args.config,
            args.cfg_options,
            args.work_dir,
            work_dir_suffix='_' + name.lower(),
        )
        cfg.load_from = None
        if args.out is not None:
            inputs = {'config': args.config, f'{name} model': args.model}
            dump_results(cfg, args.out, inputs)
        check_data(cfg, 'test_dataloader')
        runner = build_runner(cfg)
    try:
        session = runtime(args.model)
    except Exception as e:  # the runtime's own errors
        fail(
            f"{name} model '{args.model}' cannot be loaded: "
            f'{str(e).splitlines()[0] if str(e) else type(e).__name__}'
        )
    kind = model_kind(runner.model)
    outputs = getattr(session, 'num_outputs', None)
    if kind in ('two-stage', 'det', 'seg') and outputs is not None:
        expected = expected_outputs(runner.model, kind)
        if outputs not in expected:
            fail(
                f"{name} model '{args.model}' has {outputs} outputs, the "
                f"config's {kind} model gives "
                f'{" or ".join(map(str, expected))}: export this config '
                'with tools/deployment/pytorch2onnx.py'
            )
    check_test_input(runner, session, name, args.model)
    try:
        runner.model.predict = runtime_predict(runner.model, session)
    except ValueError as e:
        fail(str(e))
    try:
        return runner.test()
    except InputMismatchError as e:  # an image of another size
        fail(f'a test image does not fit: {e}')
