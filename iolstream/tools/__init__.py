"""The command line and one module per command (run, produce, evaluate, simulate, bench, snapshot),
data sets, baselines, progress and plotting helpers. Nothing imports tools but the entry point.
"""
