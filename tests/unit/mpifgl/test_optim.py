"""mpifgl.optim.Adam and SGD against torch.optim.Adam and SGD: the same parameters, bit for
bit."""
import pytest
import torch

from mpifgl.optim import SGD, Adam


def _models(dtype):
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(),
                                    torch.nn.Linear(5, 3)).to(dtype)
    ours = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 3)).to(dtype)
    ours.load_state_dict(reference.state_dict())
    return reference, ours


def _loss(model, step):
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(16, 7, generator=generator, dtype=torch.float64).to(model[0].weight.dtype)
    return (model(x) ** 2).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lr,weight_decay", [(0.01, 0.0), (0.1, 5e-4), (0.001, 0.01)])
def test_adam_is_bit_identical_to_torch(dtype, lr, weight_decay):
    assert_trains_as_torch(dtype, torch.optim.Adam, Adam, lr=lr, weight_decay=weight_decay)


def assert_trains_as_torch(dtype, torch_optimizer, our_optimizer, **settings):
    """25 steps of each on the same model and losses: the same parameters, bit for bit, and
    they moved. Returns our model and optimizer."""
    reference, ours = _models(dtype)
    torch_one = torch_optimizer(reference.parameters(), **settings)
    our_one = our_optimizer(ours.parameters(), **settings)
    for step in range(25):
        for model, optimizer in ((reference, torch_one), (ours, our_one)):
            optimizer.zero_grad(set_to_none=False)
            _loss(model, step).backward()
            optimizer.step()
    for a, b in zip(reference.parameters(), ours.parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in
               zip(reference.parameters(), _models(dtype)[0].parameters())), "nothing trained"
    return ours, our_one


def test_state_dict_round_trip_continues_identically():
    _, first = _models(torch.float64)
    _, second = _models(torch.float64)
    opt_first = Adam(first.parameters(), lr=0.05)
    for step in range(5):
        opt_first.zero_grad()
        _loss(first, step).backward()
        opt_first.step()
    second.load_state_dict(first.state_dict())
    opt_second = Adam(second.parameters(), lr=0.05)
    opt_second.load_state_dict(opt_first.state_dict())
    for model, optimizer in ((first, opt_first), (second, opt_second)):
        for step in range(5, 9):
            optimizer.zero_grad()
            _loss(model, step).backward()
            optimizer.step()
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)


def test_load_state_dict_of_another_model_is_refused():
    _, model = _models(torch.float64)
    other = torch.nn.Linear(2, 2).double()
    with pytest.raises(ValueError, match="shapes"):
        Adam(model.parameters()).load_state_dict(Adam(other.parameters()).state_dict())


def test_bad_hyper_parameters_are_named():
    with pytest.raises(ValueError, match="lr -1"):
        Adam(torch.nn.Linear(2, 2).parameters(), lr=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lr,weight_decay", [(0.5, 5e-4), (0.1, 0.0)])
def test_sgd_is_bit_identical_to_torch(dtype, lr, weight_decay):
    ours, our_sgd = assert_trains_as_torch(dtype, torch.optim.SGD, SGD, lr=lr,
                                           weight_decay=weight_decay)
    restored = SGD(ours.parameters(), lr=lr, weight_decay=weight_decay)
    restored.load_state_dict(our_sgd.state_dict())
    assert restored.step_count == 25
    with pytest.raises(ValueError, match="expected SGD's"):
        restored.load_state_dict(Adam(ours.parameters()).state_dict())
