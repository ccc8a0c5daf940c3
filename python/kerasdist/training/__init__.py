"""The training entry points, one module each.

- `distributed`: `distributed_fit`, strategy → model → pipeline → checkpoints → `resume_fit` in one call;
- `resume`: `resume_fit`, Keras `fit` continued at the next unseen batch of the newest checkpoint;
- `ps`: `ps_fit` and `run_server`, the parameter-server loop Keras 3 `fit` lacks;
- `custom_loop`: `custom_fit` and `fit_step`, a user's step through `strategy.run`, checkpointed like `fit`;
- `speed`: the speed settings (mixed precision, XLA, gradient accumulation) every trainer records.
"""

from kerasdist.training.custom_loop import custom_fit, fit_step
from kerasdist.training.distributed import check_step_functions, distributed_fit
from kerasdist.training.ps import ps_fit, run_server
from kerasdist.training.resume import resume_fit

__all__ = ["check_step_functions", "custom_fit", "distributed_fit", "fit_step", "ps_fit", "resume_fit", "run_server"]
