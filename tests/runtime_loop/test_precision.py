"""autocast_for / grad_scaler_for / ScaledStep on the CPU."""

from __future__ import annotations

import pytest
import torch

from mloc.runtime.optim import sgd
from mloc.runtime.base.precision import ScaledStep, autocast_for, grad_scaler_for


def test_fp32_is_plain():
    a = torch.randn(2, 2)
    with autocast_for("fp32", "cpu"):
        assert (a @ a).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def test_bf16_autocasts_on_the_cpu():
    a = torch.randn(2, 2)
    with autocast_for("bf16", torch.device("cpu")):
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


def test_fp16_on_the_cpu_points_to_bf16():
    from mloc.runtime.base.precision import DeviceError
    with pytest.raises(DeviceError, match="fp16 needs a CUDA device, not cpu") as err:
        autocast_for("fp16", "cpu")
    assert "bf16 (the mixed precision for the cpu)" in err.value.help


def test_unknown_precision():
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        autocast_for("fp8", "cpu")


def test_a_disabled_scaler_passes_through():
    scaler = grad_scaler_for("bf16", "cpu")
    loss = torch.tensor(2.0)
    assert scaler.scale(loss) is loss and not scaler.is_enabled()


def train_once(scaler, grad_value):
    p = torch.ones(2, requires_grad=True)
    opt = sgd(0.5)
    state = [opt.init((p,))]
    loss = (p * grad_value).sum()
    scaler.scale(loss).backward()

    def commit():
        with torch.no_grad():
            state[0] = opt.commit((p.grad,), state[0], (p,))

    scaler.step(ScaledStep((p,), commit))
    scaler.update()
    return p, state[0]


def test_scaled_step_unscales_then_steps():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)      # fp16 logic, testable on the CPU
    p, state = train_once(scaler, 2.0)
    assert p.tolist() == [0.0, 0.0] and state.count == 1           # 1 - 0.5 * 2, unscaled
    assert scaler.get_scale() == 1024.0


def test_scaled_step_skips_a_non_finite_step_and_backs_off():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    p, state = train_once(scaler, float("inf"))
    assert p.tolist() == [1.0, 1.0] and state.count == 0
    assert scaler.get_scale() == 512.0
