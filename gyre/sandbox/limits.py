"""Resource limits of one sandboxed command, applied as rlimits before exec.

RLIMIT_NPROC counts processes (and threads) per real uid, which is why the `isolated` launcher
gives every sandbox its own uid: the limit then bounds that sandbox alone (root ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    cpu_s: int | None = 3600
    """CPU seconds per process (SIGXCPU, then SIGKILL past the hard limit); None = unlimited."""
    memory_mb: int | None = 4096
    """Address space per process (RLIMIT_AS): allocations past it fail; None = unlimited."""
    max_processes: int | None = 512
    """Processes and threads of the sandbox uid (RLIMIT_NPROC; effective only under its own uid)."""
    file_size_mb: int | None = 1024
    """Largest file a process may write (SIGXFSZ / EFBIG past it)."""
    open_files: int | None = 1024
    """Open file descriptors per process."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "max_processes", "file_size_mb", "open_files"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"sandbox limit {name} must be at least 1 or None (unlimited); got {value}")

    def rlimits(self) -> dict[str, Any]:
        """The spec entry read by the sandbox supervisor (names → values; None = leave as is)."""
        return {
            "cpu_s": self.cpu_s,
            "address_space_bytes": self.memory_mb * MIB if self.memory_mb else None,
            "processes": self.max_processes,
            "file_size_bytes": self.file_size_mb * MIB if self.file_size_mb else None,
            "open_files": self.open_files,
            "core_bytes": 0,
        }
