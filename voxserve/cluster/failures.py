"""What a failed remote call means for the gateway: a refusal, a lost replica, or an error.

Ray's exception types are checked here only, so the remote engines read as policy:
refusals shrink the credit window and surface as `overloaded` / `tts_degraded`; a lost
replica is retried elsewhere; anything else is the core engine's own error.
"""

from __future__ import annotations

from voxserve.errors import ErrorCode, VoxError

# Ray is imported inside the checks: importing it reads its environment once, and
# connect.py must be able to set that environment first.


def is_refusal(exc: BaseException) -> bool:
    """The core's queue for this gateway is full (max_queued_requests)."""
    from ray.serve.exceptions import BackPressureError

    return isinstance(exc, BackPressureError)


def is_lost_replica(exc: BaseException) -> bool:
    """The replica died or cannot be reached: the call may go to another one."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError

    return isinstance(exc, (RayActorError, ReplicaUnavailableError))


def is_deployment_down(exc: BaseException) -> bool:
    """The tier's deployment failed or does not exist: retrying cannot help."""
    from ray.serve.exceptions import DeploymentUnavailableError

    return isinstance(exc, DeploymentUnavailableError)


def unavailable(tier: str, exc: BaseException) -> VoxError:
    """The tier cannot serve at all (failed deployment, replicas lost past the retries)."""
    from ray.serve.exceptions import DeploymentUnavailableError

    what = (
        "is not deployed or failed"
        if isinstance(exc, DeploymentUnavailableError)
        else "lost its replicas"
    )
    return VoxError(
        ErrorCode.ENGINE_ERROR,
        f"the cluster's {tier} tier {what} ({type(exc).__name__})",
        stage=tier,
    )


def overloaded(tier: str) -> VoxError:
    return VoxError(
        ErrorCode.OVERLOADED,
        f"the cluster's {tier} tier is at capacity; retry shortly",
        stage=tier,
        retry_after_s=1,
    )


def timed_out(tier: str, seconds: float) -> VoxError:
    return VoxError(
        ErrorCode.STAGE_TIMEOUT,
        f"the cluster's {tier} tier did not answer within {seconds:g} s",
        stage=tier,
    )
