# TensorFlow's "Multi-worker training with Keras" tutorial (tensorflow.org/tutorials/distribute/
# multi_worker_with_keras), unchanged but for one line: `import kerasdist`, which makes Keras 3's
# multi-worker fit work (keras-team/keras#20585). Run it as 2 workers on this machine:
#   kerasdist launch -n 2 -- main.py
import os
import json

import tensorflow as tf
import kerasdist  # the one line added: Keras 3's multi-worker fit works
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
