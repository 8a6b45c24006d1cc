"""What a study hands over: promotion, the bundle's report and plots, deploy artifacts, the study
summary.
"""
