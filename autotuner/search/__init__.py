"""The study: search space, rules, memory model, ask/tell loop, executors, trials, confirmation,
Pareto front.
"""
