"""Gradient sharing (Strom 2015, DL4J's ``SharedTrainingMaster``): every worker threshold-encodes its updater's
step, keeps the rest as a residual, and applies the sum of every worker's sparse message.
"""
