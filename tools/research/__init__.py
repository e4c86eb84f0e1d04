"""Stage 1, facts about the target: hardware, model, framework, knowledge.

The GPU catalog and this machine's profile, meta-device model counts, the cited framework choice.
"""
