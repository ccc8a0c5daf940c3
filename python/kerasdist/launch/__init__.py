"""The local launcher: start a whole TF_CONFIG cluster on one machine, and restart it on failure.

`launch(["train.py"], num_workers=2)` picks free ports on 127.0.0.1, builds the cluster
`{"worker": ["127.0.0.1:P0", "127.0.0.1:P1"]}` and starts one process per task, each with its own
TF_CONFIG. With `num_ps=P > 0` the cluster also gets P `"ps"` tasks and one `"chief"` task: the
coordinator of ParameterServerStrategy, which TensorFlow runs as task type "chief". Every line a
process writes is echoed with its role and index (`[worker 1] ...`). When one process fails, the
whole group is stopped and started again, so training resumes from the latest checkpoint.

Security: TensorFlow's gRPC runtime has no authentication or encryption. Anyone who can reach
the ports can run operations in the training processes. The launcher picks the ports on `host`
(127.0.0.1 by default) and TF_CONFIG names only `host`, so the processes talk over loopback; but
TensorFlow's server listens on the port on every interface (it binds 0.0.0.0:PORT whatever host
TF_CONFIG names; seen with TF 2.21). Never run it on a machine whose ports an untrusted network
can reach: firewall them, or run inside a container or network namespace without outside access.

POSIX only (process groups and signals).

The package, by what each module holds:

- `launcher`: `launch()` itself, the run from the arguments to the result;
- `command`: `resolve_command()`, the program each task runs;
- `ports`: free ports on `host`, and telling when one was taken before a server bound it;
- `process_group`: one attempt's processes, their prefixed output, stopping them;
- `result`: `LaunchResult`, `TaskFailure`, the exit codes and the launcher's messages;
- `warm_start`: Python tasks forked from a process that has already imported TensorFlow;
- `supervisor`: one task that forks its training process from itself and restarts it in place
  (`kerasdist supervise`, the Slurm recipe's tasks).
"""

from kerasdist.launch.command import resolve_command
from kerasdist.launch.launcher import launch
from kerasdist.launch.ports import PORT_CLASH_RETRIES
from kerasdist.launch.result import (
    INTERRUPTED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    LaunchResult,
    TaskFailure,
)

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "PORT_CLASH_RETRIES",
    "TIMEOUT_EXIT_CODE",
    "LaunchResult",
    "TaskFailure",
    "launch",
    "resolve_command",
]
