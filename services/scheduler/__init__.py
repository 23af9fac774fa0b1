"""The scheduler service: owns the run (dispatch, start decisions, the capacity ledger, waterlevel,
role transitions, burst boundaries, policy version)."""
