"""The math core: kernels, network, learner and its state, model and its persistence, the step tuner.

Arrays in, arrays out; imports only numpy, scipy, numba and threadpoolctl.
"""
