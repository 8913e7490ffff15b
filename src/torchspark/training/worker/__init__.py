"""The worker side of a fit: the one loop every runner calls (`loop`), its data
prefetcher, the device and thread settings of a task (`devices`,
`env`), and the hooks a worker reports progress and stats through
(`reporting`). What one epoch does is an algorithm
(`torchspark.training.algorithms`).
"""
