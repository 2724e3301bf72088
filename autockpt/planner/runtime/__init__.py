"""Running a plan: segment runners, selective recompute and spans take a traced graph or a module
chain and a choice per segment, and give the planned module that recomputes, chunks and
rebuilds its outputs as the user's model would.
"""
