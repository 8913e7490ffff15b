"""How workers talk during a fit: the [`Communicator`][torchspark.training.Communicator] protocol (collectives with a timeout) and its
implementations -- ``torch.distributed`` (gloo/nccl) across processes and hosts, threads in one process for tests,
shared memory between processes of one host (`shm`, with its FIFO barrier), and the
point-to-point `mailbox` that bounded-staleness sharing posts to.

Finding the peers in the first place (stores, tokens, ports, interfaces) is `torchspark.training.rendezvous`.
"""

from torchspark.training.comm.communicators import (
    Communicator,
    SoloCommunicator,
    StagedSum,
    ThreadCommunicator,
    ThreadGroup,
    TorchDistCommunicator,
    staged_sum,
)

__all__ = [
    "Communicator",
    "SoloCommunicator",
    "ThreadGroup",
    "ThreadCommunicator",
    "TorchDistCommunicator",
    "StagedSum",
    "staged_sum",
]
