"""What ``tools/deployment`` does, as functions: check an export against
PyTorch and evaluate it on a config's test set."""

import os.path as osp

from mmevo.deploy import (
    check_outputs,
    expected_outputs,
    model_kind,
    runtime_predict,
)

from .errors import fail, one_line_errors
from .runner import build_runner, check_data, dump_results, load_config


def report_parity(model, runtime, inputs, kind, name):
    """Print how far ``runtime`` (called ``name`` in messages) is from
    PyTorch on each input; :func:`fail` in one line if too far (see
    :func:`mmevo.deploy.check_outputs`).

    Example:
        >>> report_parity(model, OnnxModel('det.onnx'), [x], 'det',
        ...               'onnxruntime')
    """
    try:
        errs = check_outputs(model, runtime, inputs, kind)
    except ValueError as e:
        fail(f'{name} {e}')
    for x, err in zip(inputs, errs):
        print(
            f'[export] {tuple(x.shape)}: {name} vs PyTorch max relative '
            f'difference {err:.1e}'
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
            dump_results(cfg, args.out)
        check_data(cfg, ['test_dataloader'])
        runner = build_runner(cfg)
    try:
        session = runtime(args.model)
    except Exception as e:  # noqa: BLE001  (the runtime's own errors)
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
    try:
        runner.model.predict = runtime_predict(runner.model, session)
    except ValueError as e:
        fail(str(e))
    return runner.test()
