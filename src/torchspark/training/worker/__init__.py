"""The worker side of a fit: the one body every runner calls (`body`: set-up, hooks, rendezvous, errors), the
loop it runs (`loop`), its data prefetcher, the device and thread settings of a task (`devices`, `env`). What one
epoch does is an algorithm (`torchspark.training.algorithms`).
"""
