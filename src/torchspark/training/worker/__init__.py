"""The worker side of a fit: the one loop every runner calls (:mod:`~torchspark.training.worker.loop`), its data
prefetcher, the device and thread settings of a task (:mod:`~torchspark.training.worker.devices`,
:mod:`~torchspark.training.worker.env`), and the hooks a worker reports progress and stats through
(:mod:`~torchspark.training.worker.reporting`). What one epoch does is an algorithm
(:mod:`torchspark.training.algorithms`).
"""
