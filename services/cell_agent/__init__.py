"""The cell agent service (one per cell): role, rollout engine, trainer, weights and collectives."""
