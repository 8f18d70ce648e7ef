"""RocketQ: a message queue that does what Apache RocketMQ does.

The client API (producers, consumers, admin) arrives with the messaging issue; for now the
package offers the record codec shared by clients and brokers, :mod:`rocketq.codec`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rocketq")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]
