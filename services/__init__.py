"""RocketQ's server processes.

``rocketq`` is imported first: it sets grpc's experiments before anything here imports grpc
(``rocketq._grpc_env``).
"""

import rocketq as _rocketq  # noqa: F401  (for its side effect on GRPC_EXPERIMENTS)
