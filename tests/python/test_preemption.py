"""#15 item 1, the parts that need no cluster: the upstream facts the multi-worker preemption
agreement (kerasdist/preemption/agreement.py) stands on, and that one process is left alone.
The 2-worker run (SIGTERM to one worker, all exit 75, restart bitwise equal) is in test_chaos.py."""

from __future__ import annotations

import inspect
import os
import re
import time

import pytest
import tensorflow as tf
from tensorflow.python.distribute.failure_handling import failure_handling, failure_handling_util

import kerasdist
from kerasdist import compat
from kerasdist.compat import tf_cluster
from kerasdist.preemption import agreement
from kerasdist.preemption.exit import exit_on_lost_peer, peer_lost


def test_upstream_handler_still_does_nothing_on_gce_cpu_vms():
    """Fails once TensorFlow's handler works on GCE CPU VMs: then drop compat's metadata-probe fix."""
    assert compat.tensorflow_needs_preemption_fix()
    source = inspect.getsource(failure_handling.PreemptionCheckpointHandler)
    assert "TPU or CPU device on GCP" in source  # the warning it gives there
    checking = inspect.getsource(failure_handling.PreemptionCheckpointHandler.save_checkpoint_if_preempted)
    assert re.search(r"PlatformDevice\.GCE_CPU,\s*\):\s*return\n", checking)  # and then checks nothing


def test_the_metadata_probe_is_pointed_at_a_closed_local_port_and_answers_at_once():
    assert failure_handling_util._GCE_METADATA_URL_ENV_VARIABLE == tf_cluster._GCE_METADATA_VARIABLE
    before = os.environ.get(tf_cluster._GCE_METADATA_VARIABLE)
    start = time.monotonic()
    with compat.gce_metadata_probe_off():
        assert failure_handling_util.on_gcp() is False
    assert time.monotonic() - start < 2  # refused locally; upstream's own probe may wait 5 s
    assert os.environ.get(tf_cluster._GCE_METADATA_VARIABLE) == before


def test_one_process_gets_no_agreement_and_keeps_its_own_sigterm_handling():
    assert agreement.agreement_for(tf.distribute.get_strategy()) is None
    assert agreement.agreement_for(kerasdist.select_strategy("default")) is None


RESET = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from "
         "remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:")


def test_a_collective_whose_peer_went_away_is_a_lost_peer_naming_it():
    lost = peer_lost(tf.errors.UnavailableError(None, None, RESET), num_workers=2, task="worker:0")
    assert isinstance(lost, kerasdist.PeerLostExit) and lost.code == kerasdist.PEER_LOST_EXIT_CODE == 76
    assert (lost.peer, lost.detail) == ("worker:1", "Collective ops is aborted by: recvmsg:Connection reset by peer")
    # without a remote target, the task named that is not this one (the message names its own devices)
    own_devices = "Collective ops is aborted by: Socket closed [[{{node /job:worker/replica:0/task:0/device:CPU:0}}]]"
    assert peer_lost(tf.errors.UnavailableError(None, None, own_devices), 2, "worker:0").peer is None
    assert "a peer of this multi-worker cluster was lost" in str(
        peer_lost(tf.errors.UnavailableError(None, None, own_devices), 2, "worker:0"))
    # a worker cut off from the network: its own heartbeat to the coordination service times out
    cut_off = "Collective ops is aborted by: Deadline Exceeded\n\nRPC: /tensorflow.CoordinationService/Heartbeat"
    lost = peer_lost(tf.errors.DeadlineExceededError(None, None, cut_off), 2, "worker:1")
    assert (lost.peer, lost.detail) == (None, "Collective ops is aborted by: Deadline Exceeded")


RESTARTED = ("Graph execution error:\n\nDetected at node CollectiveReduceV2\nCollective ops is aborted by: group 1 "
             "not found. This normally means the server has restarted\nAdditional GRPC error information from remote "
             "target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/CompleteInstance:")


def test_a_peer_restarted_before_the_collective_noticed_is_a_lost_peer():
    """A supervisor's warm restart in place brings the chief's new server up within seconds; a
    worker whose next collective reaches it gets FAILED_PRECONDITION, its group unknown there (a
    fresh-clone run of test_supervisor's chief-killed case: exit 1, so its supervisor did not
    restart it and the chief's new process waited 60 s for it). That is a lost peer (76)."""
    lost = peer_lost(tf.errors.FailedPreconditionError(None, None, RESTARTED), 2, "worker:1")
    assert lost is not None and lost.code == 76 and lost.peer == "worker:0"
    assert lost.detail.startswith("Collective ops is aborted by: group 1 not found")
    half_formed = "group 2 failed to resolve. This normally means the server has restarted"  # no prefix
    lost = peer_lost(tf.errors.FailedPreconditionError(None, None, half_formed), 2, "worker:1")
    assert lost is not None and lost.detail == half_formed
    other = "Could not find variable dense/kernel. This could mean that the variable has been deleted."
    assert peer_lost(tf.errors.FailedPreconditionError(None, None, other), 2, "worker:1") is None


def test_other_errors_and_one_worker_are_no_lost_peer():
    assert peer_lost(tf.errors.UnavailableError(None, None, RESET), num_workers=1) is None
    assert peer_lost(tf.errors.InvalidArgumentError(None, None, RESET), num_workers=2) is None
    assert peer_lost(tf.errors.UnavailableError(None, None, "the file system is full"), num_workers=2) is None
    assert peer_lost(ValueError(RESET), num_workers=2) is None


def test_exit_on_lost_peer_ends_the_fit_says_why_and_lets_other_errors_through(capsys):
    ended = []
    with pytest.raises(kerasdist.PeerLostExit) as caught:
        with exit_on_lost_peer(2, "worker:0", lambda: ended.append(True)):
            raise tf.errors.UnavailableError(None, None, RESET)
    assert ended == [True] and caught.value.__cause__ is None
    assert capsys.readouterr().err.startswith("kerasdist: worker:1 of this multi-worker cluster was lost")
    with pytest.raises(tf.errors.UnavailableError):
        with exit_on_lost_peer(1, None, lambda: ended.append(True)):
            raise tf.errors.UnavailableError(None, None, RESET)
    assert ended == [True]
