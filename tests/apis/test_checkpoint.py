"""Checkpoints: soundness (zip and legacy files, empty, truncated, malicious
pickles in one line), the automatic resume's choice, and the strict fit of
the model (every entry, its type and shape) and optimizer states."""

import pytest
import torch
from mmengine.optim import OptimWrapper, OptimWrapperDict

from mmevo.apis import (
    CheckpointError,
    check_checkpoint_fits,
    checkpoint_error,
    find_resumable_checkpoint,
    optimizer_mismatch,
    read_checkpoint,
    state_dict_mismatch,
)
from mmevo.integrations.mmengine import safe_globals

safe_globals.install()


def _ckpt(path, step):
    torch.save(dict(meta=dict(epoch=step), state_dict={}), path)


def test_auto_resume_skips_corrupt_checkpoints(tmp_path):
    for step in (1, 2, 3):
        _ckpt(tmp_path / f'epoch_{step}.pth', step)
    (tmp_path / 'epoch_3.pth').write_bytes(
        (tmp_path / 'epoch_3.pth').read_bytes()[:500]
    )
    (tmp_path / 'epoch_2.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_3.pth'))
    with pytest.warns(UserWarning) as record:
        found = find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'epoch_1.pth')
    assert [str(w.message).split(':')[0] for w in record] == [
        f"cannot resume from '{tmp_path / 'epoch_3.pth'}'",
        f"cannot resume from '{tmp_path / 'epoch_2.pth'}'",
    ]
    assert checkpoint_error(found) is None
    # an empty last_checkpoint (a crash while mmengine wrote it) is skipped
    (tmp_path / 'last_checkpoint').write_text('')
    _ckpt(tmp_path / 'epoch_2.pth', 2)
    with pytest.warns(UserWarning, match='epoch_3.pth'):
        found = find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'epoch_2.pth')
    assert find_resumable_checkpoint(str(tmp_path / 'none')) is None


@pytest.mark.parametrize('protocol', [2, 3])
def test_legacy_format_is_accepted(tmp_path, protocol):
    state = dict(state_dict=dict(w=torch.arange(6.0).reshape(2, 3)))
    path = tmp_path / 'legacy.pth'
    torch.save(
        state,
        path,
        _use_new_zipfile_serialization=False,
        pickle_protocol=protocol,
    )
    assert checkpoint_error(str(path)) is None
    assert torch.equal(
        read_checkpoint(str(path))['state_dict']['w'], state['state_dict']['w']
    )
    # truncated, it is refused
    path.write_bytes(path.read_bytes()[:-40])
    assert checkpoint_error(str(path)).startswith('truncated legacy')
    with pytest.raises(CheckpointError, match='truncated legacy'):
        read_checkpoint(str(path))


def test_a_legacy_protocol_torch_cannot_check_is_one_line(tmp_path):
    # protocol 4: torch's weights-only unpickler does not read it
    path = tmp_path / 'legacy4.pth'
    torch.save(
        dict(state_dict={}),
        path,
        _use_new_zipfile_serialization=False,
        pickle_protocol=4,
    )
    with pytest.warns(UserWarning, match='pickle protocol'):
        with pytest.raises(CheckpointError) as info:
            read_checkpoint(str(path))
    assert str(info.value) == (
        f"checkpoint '{path}' cannot be loaded: refused by the weights-only "
        'load: Unsupported operand 149'
    )


class _Payload:
    def __reduce__(self):
        return (print, ('arbitrary code ran',))


@pytest.mark.parametrize('legacy', [False, True])
def test_a_malicious_pickle_is_one_line(tmp_path, legacy, capsys):
    path = tmp_path / 'evil.pth'
    torch.save(
        dict(state_dict={}, x=_Payload()),
        path,
        _use_new_zipfile_serialization=not legacy,
    )
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(str(path))
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith(f"checkpoint '{path}' cannot be loaded: ")
    assert 'print' in message  # the refused global is named
    assert 'arbitrary code ran' not in capsys.readouterr().out


@pytest.mark.parametrize(
    'content, reason',
    [
        (b'', 'the file is empty (0 bytes)'),
        (b'hello, world', 'truncated or not a torch checkpoint'),
        (b'PK\x03\x04 not a whole zip file', 'truncated or not a torch'),
    ],
)
def test_what_is_no_checkpoint_is_one_line(tmp_path, content, reason):
    path = tmp_path / 'x.pth'
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(str(path), what='--resume checkpoint')
    assert str(info.value).startswith(
        f"--resume checkpoint '{path}' cannot be loaded: {reason}"
    )
    with pytest.raises(CheckpointError, match='does not exist'):
        read_checkpoint(str(tmp_path / 'none.pth'))


def test_a_tensor_is_not_a_checkpoint(tmp_path):
    torch.save(torch.zeros(3), tmp_path / 't.pth')
    with pytest.raises(CheckpointError, match='holds a Tensor, not a dict'):
        read_checkpoint(str(tmp_path / 't.pth'))


def test_state_dict_mismatch():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    assert state_dict_mismatch(model, dict(state_dict=state)) == ([], [], [])
    state.pop('module.1.running_var')
    state['module.0.weight'] = torch.zeros(4, 2)
    state['module.2.weight'] = torch.zeros(1)
    assert state_dict_mismatch(model, state) == (
        ['1.running_var'],
        ['2.weight'],
        ['0.weight (checkpoint (4, 2), model (4, 3))'],
    )


def test_a_state_dict_of_floats_does_not_fit():
    model = torch.nn.Linear(3, 2)
    floats = {k: 0.5 for k in model.state_dict()}
    assert state_dict_mismatch(model, floats) == (
        [],
        [],
        [
            'weight (checkpoint float, model (2, 3))',
            'bias (checkpoint float, model (2,))',
        ],
    )
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(model, dict(state_dict=floats), 'try x', 'f.pth')
    assert str(info.value) == (
        "checkpoint 'f.pth' does not fit the model: mis-shaped keys 2 "
        '(weight (checkpoint float, model (2, 3)), bias (checkpoint float, '
        'model (2,))); try x'
    )
    with pytest.raises(CheckpointError, match='a state_dict is a dict'):
        state_dict_mismatch(model, dict(state_dict=[1, 2]))


def _wrapper(model, kind='SGD'):
    optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if kind == 'SGD'
        else torch.optim.AdamW(model.parameters(), lr=0.1)
    )
    return OptimWrapper(optimizer)


def _trained_state(model, kind='SGD'):
    wrapper = _wrapper(model, kind)
    model(torch.randn(5, 3)).sum().backward()
    wrapper.step()
    return wrapper.state_dict()


def test_optimizer_state_must_fit():
    model = torch.nn.Linear(3, 2)
    assert optimizer_mismatch(_wrapper(model), _trained_state(model)) == []
    # a wider model's state: momentum of other shapes
    wider = torch.nn.Linear(3, 5)
    assert optimizer_mismatch(_wrapper(model), _trained_state(wider)) == [
        'momentum_buffer of parameter 0 (checkpoint (5, 3), model (2, 3))',
        'momentum_buffer of parameter 1 (checkpoint (5,), model (2,))',
    ]
    # an SGD state does not resume AdamW, nor the other way round
    assert optimizer_mismatch(
        _wrapper(model, 'AdamW'), _trained_state(model)
    ) == ['param group 0 lacks betas, eps of AdamW (another optimizer type)']
    assert optimizer_mismatch(_wrapper(model), _trained_state(model, 'AdamW'))[
        0
    ].startswith('param group 0 lacks dampening, momentum')
    # other parameters, other groups, no optimizer state at all
    bigger = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    assert optimizer_mismatch(_wrapper(model), _trained_state(bigger)) == [
        "param group 0 has 4 parameters, the optimizer's 2"
    ]
    state = _trained_state(model)
    state['param_groups'] = state['param_groups'] * 2
    assert optimizer_mismatch(_wrapper(model), state) == [
        '2 param groups, the optimizer has 1'
    ]
    assert optimizer_mismatch(_wrapper(model), [0.1]) == [
        'not an optimizer state'
    ]
    both = OptimWrapperDict(a=_wrapper(model), b=_wrapper(wider))
    assert optimizer_mismatch(
        both, dict(a=_trained_state(model), b=_trained_state(model))
    ) == [
        'b: momentum_buffer of parameter 0 (checkpoint (2, 3), model (5, 3))',
        'b: momentum_buffer of parameter 1 (checkpoint (2,), model (5,))',
    ]
