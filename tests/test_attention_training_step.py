"""``bench/attention_training_step.py`` on the CPU: every column of a small row runs a forward
+ backward step, and the fused op's gradients agree with ``gdpa`` between eager norms (the
check the GPU table reports)."""

from __future__ import annotations

import pytest
import torch

import attention_training_step  # bench/
from helion_kernels.spec import AttentionRow


@pytest.mark.ref_mode
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
def test_every_column_runs_and_the_gradients_agree():
    steps, check = attention_training_step.row_steps(AttentionRow(3, 2, 32, 24, 16, 0.5, 0), device="cpu")
    assert check["check"] == "ok" and check["grad_rel_error"] < 5e-2
    assert set(steps) == {"fused", "gdpa+eager_norms", "gdpa+compiled_norms", "unfused_compiled", "unfused_eager",
                          "fused_forward"}
    for step in steps.values():
        step()
    torch._dynamo.reset()
