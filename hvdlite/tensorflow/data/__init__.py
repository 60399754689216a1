"""hvdlite.tensorflow.data: Horovod's tf.data service compute worker (horovod.tensorflow.data).

Ranks of one job run tf.data's own service servers (tf.data.experimental.service DispatchServer
and WorkerServer) for other training jobs or for themselves: compute_worker.main() (or
`python -m hvdlite.tensorflow.data.compute_worker CONFIGFILE`) starts them, coordinated through
hvdlite's compute service (hvdlite/runner/compute_service.py); a training rank reads the config
file it writes (TfDataServiceConfig.read) and then either sends its dataset to the service
(Dataset.send_to_data_service, dispatchers on the compute side) or runs the dispatcher itself
(the tf_data_service context manager, dispatchers on the training side). See the README's
TensorFlow section and docs/horovod_compat.md.
"""
