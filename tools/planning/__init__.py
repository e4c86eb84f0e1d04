"""Stage 3, the numbers: memory and speed estimates, and the one strategy search.

Estimates are arithmetic on the model and hardware; search.py is the only place a setup is chosen.
"""
