"""What every stage of the planner uses: budgets and byte units, fake copies of a module, the
dispatch-mode base and the live-bytes tracker, train/eval flags, host settings, cutting a batch,
output structures and fixed randomness. It takes nothing from the other stages.
"""
