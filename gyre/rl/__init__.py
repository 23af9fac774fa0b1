"""The RL objective and stream packing: pure library code shared by the packer and the trainers.

Nothing here talks to a broker, a store or an engine (a test enforces it); the modules are:

- `advantages`  group-relative advantages over the resolved members of a group
- `ordering`    which ready group the packer takes next (oldest policy version, then oldest ready time)
- `packing`     rows (path or tree rows) → micro-steps under a token budget, with the per-token
                coefficient 1/(L_i·B·N)
- `microstep`   the `MicroStep` record a cell trains on (with a `TreeLayout` when it holds tree rows)
- `codec`       a versioned bytes format for a `MicroStep` (it travels through the Redis queue)
- `stream`      the stream packing buffer: groups in, full micro-steps out
- `loss`        the GSPO-variant loss (torch)
- `loss_metrics` its additive metrics (clip and mask fractions, ratios, the train/inference mismatch)
- `corrections` the opt-in mismatch corrections' masks and the normalizer they change
- `step_loss`   a micro-step's loss given a logits function, chunked for executions over the budget

The layout of tree rows (`TreeLayout`) and the attention that reads it (`packed_attention`) belong to
the model (`gyre.model.tree_layout`, `gyre.model.attention`). Only `loss`, `corrections` and `step_loss`
import torch, so the packer can stay torch-free.
"""
