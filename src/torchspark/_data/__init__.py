"""Package data: the built-in digits data set (``torchspark.datasets.digits``)."""
