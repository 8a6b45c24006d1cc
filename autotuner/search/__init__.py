"""The study: rules, priors, the ask/tell loop, executors, trials, confirmation and its
decision, Pareto front, engine-version comparison.
"""
