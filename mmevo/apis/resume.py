"""Does a checkpoint resume a run: its model and optimizer states against
the runner's, checked before ``runner.train()`` would load them partly."""

import copy

import torch
from mmengine.optim import OptimWrapper, OptimWrapperDict

from .checkpoint import _MAX_KEYS, CheckpointError, _model_problems


def _numeric(value):
    return isinstance(
        value, (int, float, tuple, torch.Tensor)
    ) and not isinstance(value, bool)


def optimizer_mismatch(optim_wrapper, state):
    """What keeps ``state`` (a checkpoint's ``optimizer``) from resuming
    ``optim_wrapper``.

    Compares the param groups (their number, each one's number of
    parameters, and the numeric hyperparameters of the optimizer's type,
    so that an SGD state does not resume AdamW) and the shape of every
    per-parameter tensor (momentum, moments) with its parameter's.

    Args:
        optim_wrapper (OptimWrapper | OptimWrapperDict): Built.
        state (dict): The saved state.

    Returns:
        list[str]: The problems; empty when it fits.

    Example:
        >>> optimizer_mismatch(runner.optim_wrapper, ckpt['optimizer'])
        []
    """
    if isinstance(optim_wrapper, OptimWrapperDict):
        if not isinstance(state, dict) or set(state) != set(
            optim_wrapper.keys()
        ):
            return [
                f'optimizers {sorted(optim_wrapper.keys())}, checkpoint '
                f'{sorted(state) if isinstance(state, dict) else state}'
            ]
        return [
            f'{name}: {problem}'
            for name, wrapper in optim_wrapper.items()
            for problem in optimizer_mismatch(wrapper, state[name])
        ]
    optimizer = optim_wrapper.optimizer
    if (
        not isinstance(state, dict)
        or not isinstance(state.get('param_groups'), list)
        or not isinstance(state.get('state'), dict)
    ):
        return ['not an optimizer state']
    saved_groups, groups = state['param_groups'], optimizer.param_groups
    if len(saved_groups) != len(groups):
        return [
            f'{len(saved_groups)} param groups, the optimizer has '
            f'{len(groups)}'
        ]
    kind = {k for k, v in optimizer.defaults.items() if _numeric(v)}
    problems, params = [], {}
    for i, (saved, group) in enumerate(zip(saved_groups, groups, strict=True)):
        saved_params = saved.get('params') if isinstance(saved, dict) else 0
        if not isinstance(saved_params, list):
            problems.append(f'param group {i} is not a param group')
            continue
        if len(saved_params) != len(group['params']):
            problems.append(
                f'param group {i} has {len(saved_params)} parameters, the '
                f"optimizer's {len(group['params'])}"
            )
        else:
            params.update(zip(saved_params, group['params'], strict=True))
        lacking = sorted(kind - set(saved))
        if lacking:
            problems.append(
                f'param group {i} lacks {", ".join(lacking)} of '
                f'{type(optimizer).__name__} (another optimizer type)'
            )
    for index, entry in state['state'].items():
        param = params.get(index)
        if param is None or not isinstance(entry, dict):
            continue  # the group was reported above
        for name, value in entry.items():
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and value.shape != param.shape
            ):
                problems.append(
                    f'{name} of parameter {index} (checkpoint '
                    f'{tuple(value.shape)}, model {tuple(param.shape)})'
                )
    return problems


def check_resume_fits(runner, checkpoint, name):
    """Raise unless ``checkpoint``'s model and optimizer states fit
    ``runner`` (before ``runner.train()``, which would load them partly).

    Args:
        runner (mmengine.runner.Runner): Built, not trained yet.
        checkpoint (dict): The checkpoint to resume from.
        name (str): Its path, for the message.

    Raises:
        CheckpointError: One line naming what does not fit.

    Example:
        >>> check_resume_fits(runner, read_checkpoint(path), path)
    """
    problems = [
        f'model: {p}' for p in _model_problems(runner.model, checkpoint)
    ]
    if 'optimizer' in checkpoint and runner.optim_wrapper is not None:
        wrapper = runner.optim_wrapper
        if not isinstance(wrapper, (OptimWrapper, OptimWrapperDict)):
            # the runner builds its own in train(); this one is thrown away
            wrapper = runner.build_optim_wrapper(copy.deepcopy(wrapper))
        problems += [
            f'optimizer: {p}'
            for p in optimizer_mismatch(wrapper, checkpoint['optimizer'])
        ]
    if problems:
        raise CheckpointError(
            f"--resume checkpoint '{name}' does not fit: "
            f'{"; ".join(problems[:_MAX_KEYS])}'
            + (
                f'; ... and {len(problems) - _MAX_KEYS} more'
                if len(problems) > _MAX_KEYS
                else ''
            )
        )
