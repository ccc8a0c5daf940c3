"""#15 item 1, the parts that need no cluster: the upstream facts the multi-worker preemption
agreement (kerasdist/preemption/agreement.py) stands on, and that one process is left alone.
The 2-worker run (SIGTERM to one worker, all exit 75, restart bitwise equal) is in test_chaos.py."""

from __future__ import annotations

import inspect
import os
import re
import time

import tensorflow as tf
from tensorflow.python.distribute.failure_handling import failure_handling, failure_handling_util

import kerasdist
from kerasdist import compat
from kerasdist.preemption import agreement


def test_upstream_handler_still_does_nothing_on_gce_cpu_vms():
    """Fails once TensorFlow's handler works on GCE CPU VMs: then drop compat's metadata-probe fix."""
    assert compat.tensorflow_needs_preemption_fix()
    source = inspect.getsource(failure_handling.PreemptionCheckpointHandler)
    assert "TPU or CPU device on GCP" in source  # the warning it gives there
    checking = inspect.getsource(failure_handling.PreemptionCheckpointHandler.save_checkpoint_if_preempted)
    assert re.search(r"PlatformDevice\.GCE_CPU,\s*\):\s*return\n", checking)  # and then checks nothing


def test_the_metadata_probe_is_pointed_at_a_closed_local_port_and_answers_at_once():
    assert failure_handling_util._GCE_METADATA_URL_ENV_VARIABLE == compat._GCE_METADATA_VARIABLE
    before = os.environ.get(compat._GCE_METADATA_VARIABLE)
    start = time.monotonic()
    with compat.gce_metadata_probe_off():
        assert failure_handling_util.on_gcp() is False
    assert time.monotonic() - start < 2  # refused locally; upstream's own probe may wait 5 s
    assert os.environ.get(compat._GCE_METADATA_VARIABLE) == before


def test_one_process_gets_no_agreement_and_keeps_its_own_sigterm_handling():
    assert agreement.agreement_for(tf.distribute.get_strategy()) is None
    assert agreement.agreement_for(kerasdist.select_strategy("default")) is None
