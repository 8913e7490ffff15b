"""The driver side of a fit, the same for every adapter: :func:`~torchspark.training.driver.fit.run_fit` builds the
task, opens progress and stats, asks a :class:`~torchspark.training.driver.runner.Runner` to run the workers, maps
their failures (:mod:`~torchspark.training.driver.failures`), decides on retries
(:mod:`~torchspark.training.driver.recovery`) and merges the results and stats
(:mod:`~torchspark.training.driver.stats`).

A change to "how workers are started" is a runner (here the in-process one; Spark's in :mod:`torchspark.spark`,
local processes in :mod:`torchspark.parallel`); a change to "what happens when a worker dies" is here.
"""
