"""The driver side of a fit, the same for every adapter: `run_fit` builds the
task, opens progress and stats, asks a [`Runner`][torchspark.training.Runner] to run the workers, maps
their failures (`failures`), decides on retries
(`recovery`) and merges the results and stats
(`stats`).

A change to "how workers are started" is a runner (here the in-process one; Spark's in [`torchspark.spark`][torchspark.spark],
local processes in [`torchspark.parallel`][torchspark.parallel]); a change to "what happens when a worker dies" is here.
"""
