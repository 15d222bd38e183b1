"""A simulated Kubernetes cluster for jobsup's tests and benchmarks.

It speaks the Kubernetes HTTP API on loopback (TLS, bearer tokens, a generated
kubeconfig) so that the official ``kubernetes`` client is what tests exercise;
Jobs run as real local processes. See README.md in this folder for what it
covers and what it does not.

Typical use::

    from tests.k8s_sim import SimCluster

    with SimCluster.start(tmp_path) as sim:
        api = kubernetes.client.BatchV1Api(sim.api_client())
        ...
"""

from .cluster import SimCluster
from .faults import Faults
from .kubelet import MISSING_REGISTRY, NODE_NAME
from .server import AccessRule
from .util import ApiError, SimError

__all__ = ["MISSING_REGISTRY", "NODE_NAME", "AccessRule", "ApiError", "Faults", "SimCluster", "SimError"]
