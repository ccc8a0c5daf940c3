"""Preemption: what a SIGTERM does at any instant, and who holds the signal when.

A scheduler's preemption (Slurm's `scancel --signal=TERM`, its time-limit warning, a Kubernetes
pod's deletion) can reach a task at any instant. The rule: at each moment one holder has SIGTERM,
and hands it back to the one before when its time ends.

1. From `import kerasdist`, in a cluster task (Slurm step, TF_CONFIG): `signals.exit_preempted`,
   with a watcher thread. A SIGTERM exits 75 at once: there is nothing to save.
2. While a multi-worker strategy forms the cluster: TensorFlow's coordination agent (C++). A
   SIGTERM is noted in the cluster's store. Once the cluster formed, a `signals.ClusterStartHold`
   takes SIGTERM and records it, every worker reads the notice, they agree, and all exit 75
   before training. A strategy the user made gets the same at kerasdist's first call on it
   (`context.context_of`).
3. During a fit: the checkpoint callback, through a `signals.SigtermHold`, with its own handler, or
   under multi-worker with TensorFlow's `PreemptionCheckpointHandler` (`agreement`). A SIGTERM
   saves at the next (agreed) step, stops, and raises `PreemptedExit` (75, the checkpoint named).
4. While `kerasdist launch` runs: the launcher, through a `SigtermHold`. A SIGTERM stops the group.
5. Once the interpreter exits by itself: nobody (ignored). The exit status already says what
   happened.

A peer lost mid-fit (its process killed, its host down) is no signal but TensorFlow's error in a
collective: `exit.exit_on_lost_peer` turns it into `PeerLostExit` (76), nothing saved, the newest
checkpoint intact. A fit that stops stepping (a hang: no step for `hang_timeout`) is no signal
either: the checkpoint callback's watchdog ends the process with 77 (`HUNG_EXIT_CODE`).

Modules: `exit` (statuses 75, 76 and 77, `PreemptedExit` and `PeerLostExit`), `signals`
(the handlers and who holds SIGTERM), `agreement` (multi-worker: every worker stops at one agreed
step; imports TensorFlow, so it is imported where it is used).
"""

from kerasdist.preemption.exit import (
    HUNG_EXIT_CODE,
    PEER_LOST_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    PeerLostExit,
    PreemptedExit,
    exit_on_lost_peer,
    exit_preempted,
)
from kerasdist.preemption.signals import SigtermHold

__all__ = ["HUNG_EXIT_CODE", "PEER_LOST_EXIT_CODE", "PREEMPTED_EXIT_CODE", "PeerLostExit", "PreemptedExit",
           "SigtermHold", "exit_on_lost_peer", "exit_preempted"]
