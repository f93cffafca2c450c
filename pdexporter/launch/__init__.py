"""Ways of getting an engine: one module per launcher, a shared base (handle, protocols, process
groups), and the providers a sweep draws drivers from."""

from pdexporter.launch.base import (
    Adopting,
    Attaching,
    DeadlineReached,
    EngineHandle,
    Launcher,
    LogDirected,
    Preparing,
    Prestarting,
    Releasing,
    TraceDirected,
    terminate_group,
)
from pdexporter.launch.external import ExternalLauncher
from pdexporter.launch.sim import SimLauncher

__all__ = [
    "Adopting", "Attaching", "DeadlineReached", "EngineHandle", "ExternalLauncher", "Launcher", "LogDirected",
    "Preparing", "Prestarting", "Releasing", "SimLauncher", "TraceDirected", "terminate_group",
]
