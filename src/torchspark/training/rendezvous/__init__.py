"""How workers find each other before a fit: key-value stores signed with the fit's token
(`stores`, `auth`), ports inside a
user's range (`ports`) and the address and interface a host advertises
(`netif`). Talking once found is `torchspark.training.comm`.
"""
