"""Starting or joining Ray for a campaign."""
from __future__ import annotations

import logging
import math
import os

log = logging.getLogger(__name__)


def ensure_ray(address: str | None, resources) -> float:
    """Join ``address``/RAY_ADDRESS, or start an embedded Ray sized for the campaign.

    Returns the number of GPUs the cluster has (0 on CPU-only machines, where
    ``num_gpus`` of the campaign is dropped and the campaign runs on the CPU).
    """
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            join_ray(address)
        else:
            need = max(1, math.ceil(resources.num_actors * resources.num_cpus))
            # Ray counts the GPUs itself (NVML, CUDA_VISIBLE_DEVICES): the driver needs no torch
            ray.init(num_cpus=need, include_dashboard=False, log_to_driver=False, configure_logging=False)
    total = float(ray.cluster_resources().get("GPU", 0))
    if resources.num_gpus and not total:
        log.warning("the campaign asks for %s GPU per actor but the cluster has none: running on CPU",
                    resources.num_gpus)
    return total


def join_ray(address: str) -> None:
    """Join the running cluster at ``address``, unless this process already has."""
    import ray

    if not ray.is_initialized():
        # configure_logging=False: no Ray log lines (with colour codes) in `ray job logs`
        ray.init(address=address, log_to_driver=False, configure_logging=False)

