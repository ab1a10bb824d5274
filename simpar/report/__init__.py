"""What a run leaves behind: the metrics document (metrics.py), the tables on the terminal (tables.py),
the pictures (plots.py: traffic, memory, scaling, sweeps; timeline.py: pipeline timelines).

Plots import matplotlib only when they draw, so `simpar train` never loads it.
"""
