"""The training row: one admitted trajectory materialized as tokens, the contract between the
trajectory processor (writer) and the RL objective / packer (reader).

Alignment convention (the usual causal-LM one): `token_ids[t]` is a target when
`target_mask[t]` is true; it is predicted from the logits at position t - 1, so position 0 is
never a target. `behaviour_logprobs[t]` is the log-prob the engine recorded when it sampled
`token_ids[t]` (0.0 where the token is not a target).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(slots=True, frozen=True)
class TrajectoryRow:
    """One admitted root-to-leaf path of an execution's tree."""

    execution_id: str
    """Execution the trajectory belongs to."""
    trajectory_index: int
    """Draw order within the execution's admission (0 = first admitted)."""
    leaf_class: str
    """`main`, `main_summary`, `sub_agent` or `sub_agent_summary`."""
    token_ids: npt.NDArray[np.int32]
    """Token ids of the whole path, root to leaf."""
    target_mask: npt.NDArray[np.bool_]
    """True where the token is one of this trajectory's frozen targets."""
    behaviour_logprobs: npt.NDArray[np.float32]
    """Recorded behaviour log-prob of each target token; 0.0 elsewhere."""
    policy_versions: npt.NDArray[np.int32]
    """Policy version that sampled each token (-1 where the token was supplied, not sampled)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not (len(self.target_mask) == len(self.behaviour_logprobs) == len(self.policy_versions) == n):
            raise ValueError("row arrays must all have the length of token_ids")
        if n and bool(self.target_mask[0]):
            raise ValueError("position 0 cannot be a target (nothing precedes it)")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())
