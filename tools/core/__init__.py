"""Stage 0, the vocabulary every stage shares; imports nothing else of ours.

Plan-contract types, errors, settings, atomic files, strategy names, the import warm-up.
"""
