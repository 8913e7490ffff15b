"""How workers find each other before a fit: key-value stores signed with the fit's token
(:mod:`~torchspark.training.rendezvous.stores`, :mod:`~torchspark.training.rendezvous.auth`), ports inside a
user's range (:mod:`~torchspark.training.rendezvous.ports`) and the address and interface a host advertises
(:mod:`~torchspark.training.rendezvous.netif`). Talking once found is :mod:`torchspark.training.comm`.
"""
