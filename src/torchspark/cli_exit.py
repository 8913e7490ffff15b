"""The ``torchspark`` command's exit codes: what a scheduler (cron, Airflow, a CI job) reads to decide between
"fix the command" and "run it again".

=====  ==========================================================================================================
code   meaning
=====  ==========================================================================================================
0      the command did what it was asked
1      a runtime failure: the command line was right, the run failed (a worker raised or was lost, the training
       diverged, the environment could not run it: no Java, too few task slots, a disk that filled up)
2      a usage error: a bad argument or option value, a bad ``--config`` file, an input (``--data``, ``--model``)
       that cannot be read, or an ``--output`` the command refuses to write; found before any training starts
130    interrupted (Ctrl-C, SIGINT): 128 + the signal's number, as a shell reports it
=====  ==========================================================================================================

`EXIT_CODES` maps each [`TorchSparkError`][torchspark.cli.TorchSparkError] class to its code; a subclass not listed
takes the code of its nearest listed ancestor (`exit_code`). argparse's own errors (an unknown option, a
value of the wrong type) exit 2 before any of this runs.
"""

from __future__ import annotations

from torchspark.errors import (
    ConfigError,
    DataError,
    EncodingError,
    PeerLost,
    SerializationError,
    SetupError,
    TorchSparkError,
    TrainingError,
    WaitTimeout,
    WorkerError,
    WorkerLost,
)

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_CODES", "exit_code"]

#: the command did what it was asked
EXIT_OK = 0
#: a runtime failure: the run failed, the command line was right
EXIT_FAILURE = 1
#: a usage error (argparse's code too): fix the command line, its files or its inputs
EXIT_USAGE = 2
#: interrupted by Ctrl-C (128 + SIGINT)
EXIT_INTERRUPTED = 130

#: each error class -> the exit code the command returns when it ends with it (the most specific class first)
EXIT_CODES: dict[type[BaseException], int] = {
    ConfigError: EXIT_USAGE,  # an option, a combination of options, a --config file, an --output refused
    DataError: EXIT_USAGE,  # the input data (--data) is malformed; a worker's DataError reaches here as WorkerError
    SerializationError: EXIT_USAGE,  # the saved model (--model) cannot be read
    WorkerLost: EXIT_FAILURE,  # a worker, its process or executor was lost
    WorkerError: EXIT_FAILURE,  # a worker raised (its traceback follows the message)
    TrainingError: EXIT_FAILURE,  # the fit failed: diverged, a dead Spark driver JVM
    EncodingError: EXIT_FAILURE,  # a corrupt message between workers
    PeerLost: EXIT_FAILURE,
    WaitTimeout: EXIT_FAILURE,  # a blocking wait ran out of time
    SetupError: EXIT_FAILURE,  # the environment: Java, pyspark, task slots, a full disk
    TorchSparkError: EXIT_FAILURE,  # anything else torchspark raises
}


def exit_code(error: BaseException) -> int:
    """The exit code for a command that ended with ``error``: `EXIT_INTERRUPTED` for a KeyboardInterrupt,
    else the code `EXIT_CODES` gives the nearest listed class of ``error`` (`EXIT_FAILURE` for an error
    that is not torchspark's)."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_FAILURE
