"""Stage 2, what the user asked: brief files and free-text requests.

Requests are read against the catalogs of stage 1; the result is a validated TrainingBrief.
"""
