"""Gyre's services, one package each: scheduler, proxy, runner, evaluator, packer, cell_agent."""
